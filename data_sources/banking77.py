"""Banking77 (PolyAI): which of several intents does a banking customer's message express (choice).

Each message becomes a choice between its gold intent and ``num_distractors`` (default 9) other intents drawn
at random from the 77, the gold one placed at a random position; option ids are the intent names and their
descriptions the names made readable (``card_arrival`` → "Card arrival"). ``all_options=True`` shows all 77
intents in the dataset's order instead. The draw for a row depends only on ``seed``, the split and the row, so
it does not change when other rows are added or ``limit`` changes.

Local files in the published layouts: the CSV files ``train.csv`` / ``test.csv`` (columns ``text``,
``category`` = the intent name), or JSONL / Parquet exports of the Hugging Face dataset (``text``, ``label`` =
the class index 0..76 or the intent name). The split name in ids is the file's stem. With no path the Hugging
Face dataset ``PolyAI/banking77`` is loaded (online), ``split`` ``train`` or ``test``.

Records: task ``banking77``, id ``banking77-<split>-<line or row>``, lang ``en``, state = the message.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from data_sources._files import Row, capped, error_row, existing, file_stem, iter_hub, iter_rows, load_hub

HUB_NAME = "PolyAI/banking77"
TASK = "banking77"
INSTRUCTIONS = "Which intent does this banking customer's message express?"

# The 77 intents in the order of the dataset's class indices (two keep their published odd spelling).
INTENTS: tuple[str, ...] = (
    "activate_my_card",
    "age_limit",
    "apple_pay_or_google_pay",
    "atm_support",
    "automatic_top_up",
    "balance_not_updated_after_bank_transfer",
    "balance_not_updated_after_cheque_or_cash_deposit",
    "beneficiary_not_allowed",
    "cancel_transfer",
    "card_about_to_expire",
    "card_acceptance",
    "card_arrival",
    "card_delivery_estimate",
    "card_linking",
    "card_not_working",
    "card_payment_fee_charged",
    "card_payment_not_recognised",
    "card_payment_wrong_exchange_rate",
    "card_swallowed",
    "cash_withdrawal_charge",
    "cash_withdrawal_not_recognised",
    "change_pin",
    "compromised_card",
    "contactless_not_working",
    "country_support",
    "declined_card_payment",
    "declined_cash_withdrawal",
    "declined_transfer",
    "direct_debit_payment_not_recognised",
    "disposable_card_limits",
    "edit_personal_details",
    "exchange_charge",
    "exchange_rate",
    "exchange_via_app",
    "extra_charge_on_statement",
    "failed_transfer",
    "fiat_currency_support",
    "get_disposable_virtual_card",
    "get_physical_card",
    "getting_spare_card",
    "getting_virtual_card",
    "lost_or_stolen_card",
    "lost_or_stolen_phone",
    "order_physical_card",
    "passcode_forgotten",
    "pending_card_payment",
    "pending_cash_withdrawal",
    "pending_top_up",
    "pending_transfer",
    "pin_blocked",
    "receiving_money",
    "Refund_not_showing_up",
    "request_refund",
    "reverted_card_payment?",
    "supported_cards_and_currencies",
    "terminate_account",
    "top_up_by_bank_transfer_charge",
    "top_up_by_card_charge",
    "top_up_by_cash_or_cheque",
    "top_up_failed",
    "top_up_limits",
    "top_up_reverted",
    "topping_up_by_card",
    "transaction_charged_twice",
    "transfer_fee_charged",
    "transfer_into_account",
    "transfer_not_received_by_recipient",
    "transfer_timing",
    "unable_to_verify_identity",
    "verify_my_identity",
    "verify_source_of_funds",
    "verify_top_up",
    "virtual_card_not_working",
    "visa_or_mastercard",
    "why_verify_identity",
    "wrong_amount_of_cash_received",
    "wrong_exchange_rate_for_cash_withdrawal",
)


def readable(intent: str) -> str:
    """An intent name as a description: ``card_arrival`` → ``Card arrival``."""
    text = intent.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def intent_of(row: dict[str, Any], names: Sequence[str]) -> str:
    """The gold intent of a row (``category``, or ``label`` as index or name); ValueError names the column."""
    column = "category" if "category" in row else "label"
    value = row.get(column)
    if value is None or value == "":
        raise ValueError(f"column {column!r} is missing or empty (expected 'category' or 'label')")
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(names):
            raise ValueError(f"column {column!r}: class index {value} is outside 0..{len(names) - 1}")
        return names[value]
    text = str(value).strip()
    if text.isdigit() and text not in names:
        return intent_of({column: int(text)}, names)
    if text not in names:
        raise ValueError(f"column {column!r}: {text!r} is not one of the 77 Banking77 intents")
    return text


def shown_options(
    gold: str, names: Sequence[str], rng: random.Random, num_distractors: int, all_options: bool
) -> list[str]:
    """The option ids shown for one question: all intents, or the gold one among sampled distractors."""
    if all_options:
        return list(names)
    options = [*rng.sample([n for n in names if n != gold], num_distractors), gold]
    rng.shuffle(options)
    return options


def _records(
    rows: Iterable[Row], split: str, names: Sequence[str], seed: int, num_distractors: int, all_options: bool
) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            yield error_row(where, "column 'text' is missing or empty", row)
            continue
        try:
            gold = intent_of(row, names)
        except ValueError as err:
            yield error_row(where, str(err), row)
            continue
        number = where.rsplit(":", 1)[1]
        rng = random.Random(f"{TASK}:{seed}:{split}:{number}")
        options = shown_options(gold, names, rng, num_distractors, all_options)
        yield {
            "id": f"{TASK}-{split}-{number}",
            "task": TASK,
            "lang": "en",
            "state": text.strip(),
            "question": {"type": "choice", "instructions": INSTRUCTIONS, "criteria": {o: readable(o) for o in options}},
            "answer": gold,
            "_where": where,
        }


def convert(
    path: str | None = None,
    *,
    limit: int | None = None,
    seed: int = 13,
    split: str = "train",
    num_distractors: int = 9,
    all_options: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yield one choice record per message of ``path`` (or of the Hugging Face split if ``path`` is None)."""
    whole = isinstance(num_distractors, int) and not isinstance(num_distractors, bool)
    if not whole or not 1 <= num_distractors <= len(INTENTS) - 1:
        raise ValueError(
            f"banking77 source: option 'num_distractors' must be an integer 1..76, got {num_distractors!r}"
        )
    if not isinstance(all_options, bool):
        raise ValueError(f"banking77 source: option 'all_options' must be true or false, got {all_options!r}")
    if path is None:
        dataset = load_hub(HUB_NAME, split)
        names = list(dataset.features["label"].names)
        rows = iter_hub(dataset, HUB_NAME, split)
        return capped(_records(rows, split, names, seed, num_distractors, all_options), limit)
    existing(path)
    rows = iter_rows(path)
    return capped(_records(rows, file_stem(path), INTENTS, seed, num_distractors, all_options), limit)
