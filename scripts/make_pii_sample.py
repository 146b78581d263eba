"""Generate ``pii_spans.jsonl``: made-up texts with personal data (names, e-mails, phones, addresses) and their spans.

Development tool of the repository (``scripts/``), not part of the package; it writes the shipped sample,
``data_sources/samples/pii_spans.jsonl``, unless given ``--out``. It needs Faker (``pip install faker==40.63.0``),
which is not a runtime dependency of mydecide. Every name, e-mail address, phone number and postal address in the
output is invented by Faker; the texts around them come from the templates below. The output depends on the Faker
version (its word lists change), so the script refuses another version unless given ``--any-faker``; the shipped
file was made with Faker 40.63.0 and ``--seed 13 --count 800``:

    python scripts/make_pii_sample.py --out data_sources/samples/pii_spans.jsonl

Each line: ``{"id", "kind", "locale", "text", "spans": [{"start", "end", "label", "text"}]}``; offsets are
character offsets (Python string indices), end exclusive. Spans cover the personal data itself: a comma, full
stop or bracket next to it stays outside (``<anna@example.se>`` → the span is the address without ``<`` ``>``),
so such a span is not word-aligned; the converter's word mapping counts the whole word as positive.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import unicodedata
from pathlib import Path
from typing import Any

FAKER_VERSION = "40.63.0"
SAMPLE = Path(__file__).resolve().parent.parent / "data_sources" / "samples" / "pii_spans.jsonl"
LOCALES = ["en_US", "en_GB", "de_DE", "fr_FR", "sv_SE", "es_ES", "pl_PL"]
LABELS = {"name": "PERSON", "first": "PERSON", "last": "PERSON", "agent": "PERSON", "agent_first": "PERSON",
          "other": "PERSON", "email": "EMAIL", "email2": "EMAIL", "phone": "PHONE", "address": "ADDRESS"}  # fmt: skip
SLOT = re.compile(r"\{(\w+)\}")

# Sentence pools per kind of text. A slot in braces is filled per record; slots in LABELS are personal data.
TICKET_OPEN = [
    "Ticket #{ticket} opened by {name}.",
    "{name} reported that the {product} stopped syncing after the last update.",
    "Customer {name} cannot log in since {date}.",
    "New ticket from {name} about a double charge of {amount}.",
    "Order {order}: {name} says the parcel arrived damaged.",
    "Escalated: {name} has been waiting for a refund of {amount} since {date}.",
]
TICKET_MORE = [
    "Please call back on {phone} before {time}.",
    "Reply to {email} once the fix is deployed.",
    "The customer can be reached at {phone} or {email}.",
    "Billing address on file: {address}.",
    "{agent} already checked the logs and found nothing unusual.",
    "Assigned to {agent}.",
    "{first} mentioned this happened twice last week.",
    "The issue started after upgrading to version {version}.",
    "Priority set to high because the account is on the {plan} plan.",
    "Error code {code} shows up on every attempt.",
    "Steps to reproduce are attached.",
    "No workaround is known yet.",
    "Send the replacement to {address}.",
    "{first} prefers e-mail over phone calls.",
]
EMAIL_OPEN = [
    "From: {name} <{email}>\nSubject: {subject}\n\nHi {agent_first},",
    "From: {email}\nSubject: {subject}\n\nHello,",
    "Hi {agent_first},",
    "Dear {agent},",
    "Good morning,",
]
EMAIL_MORE = [
    "I am writing about my order {order}.",
    "Could you update my phone number to {phone}?",
    "My new address is {address}.",
    "Please send the invoice to {email} instead.",
    "{agent} told me on {date} that the refund was approved, but nothing has arrived.",
    "You can reach me at {phone} during office hours.",
    "The {product} works again after the reset, thanks for the help.",
    "I have attached the receipt for {amount}.",
    "Let me know if you need anything else.",
    "My colleague {other} will pick it up on {date}.",
    "Our meeting is moved to {time} on {date}.",
]
EMAIL_CLOSE = ["Best regards,\n{name}", "Thanks,\n{first}", "Kind regards,\n{name}\n{phone}", "Cheers,\n{first}"]
CHAT_LINES = [
    "[{time}] {first}: hi, is anyone there?",
    "[{time}] {first}: my number is {phone} if that's easier",
    "[{time}] {agent_first}: hello {first}, how can I help?",
    "[{time}] {first}: the {product} keeps restarting",
    "[{time}] {agent_first}: could you confirm the e-mail on the account?",
    "[{time}] {first}: it's {email}",
    "[{time}] {agent_first}: thanks, I see order {order}",
    "[{time}] {first}: ok great",
    "[{time}] {agent_first}: I have sent a new code to {email}",
    "[{time}] {first}: can you ship it to {address} instead?",
    "[{time}] {agent_first}: done, anything else?",
    "[{time}] {first}: no that's all, thanks",
]
CV_MORE = [
    "Experience: {years} years as a {job} at {company}.",
    "Education: MSc in {field}, {year}.",
    "Languages: {languages}.",
    "References available from {other} ({email2}).",
    "Skills: Python, SQL, project planning and {skill}.",
    "Currently working as a {job} in {city}.",
]
SHIP_OPEN = [
    "Deliver to: {name}, {address}.",
    "Shipping note for order {order}: recipient {name}.",
    "Parcel {tracking} for {name}.",
    "Recipient: {name}\nAddress: {address}\nPhone: {phone}",
]
SHIP_MORE = [
    "Contact number: {phone}.",
    "Leave the parcel with the neighbour if nobody answers.",
    "Address: {address}.",
    "Call {first} on {phone} before delivery.",
    "Fragile, keep upright.",
    "Delivery window {time} to {time2}.",
    "Signed for by {other}.",
    "Notify {email} when the parcel is out for delivery.",
]
NO_PII = [
    "The {product} firmware {version} fixes the battery drain reported last month.",
    "Order {order} was shipped on {date} and should arrive within three working days.",
    "Our office in {city} is closed on public holidays.",
    "Refunds of up to {amount} are processed automatically.",
    "Error code {code} means the device lost its network connection.",
    "Please restart the router and try again.",
    "The {plan} plan includes priority support and 200 GB of storage.",
    "Tracking number {tracking} shows the parcel at the sorting centre.",
    "{company} will update its privacy policy on {date}.",
    "Maintenance is scheduled from {time} to {time2} tonight.",
    "Customers can return unused items within 30 days.",
    "The warehouse in {city} handles all orders from the region.",
    "Invoices are sent by e-mail at the end of each month.",
    "The support team answers chat messages within ten minutes.",
    "A software update for the {product} is available from {date}.",
    "Prices on the {plan} plan rise to {amount} per month next year.",
    "The courier collects parcels from the {city} depot at {time}.",
    "Version {version} removes the old login page.",
    "If the {product} shows error {code}, unplug it for thirty seconds.",
    "Returns for order {order} were received and checked.",
    "{company} reported record sales in the second quarter.",
    "Gift cards cannot be exchanged for cash.",
    "The new warehouse near {city} opens on {date}.",
    "Two-factor login is now required for every account.",
    "Delivery times may be longer during the holiday season.",
    "The help centre lists answers to the most common questions.",
    "Parcels over 20 kg are delivered by a separate courier.",
    "The {plan} plan can be cancelled at any time.",
    "Order {order} is waiting for payment of {amount}.",
    "Our opening hours are {time} to {time2} on weekdays.",
]
NATIVE = {  # one sentence in the locale's own language per slot mix
    "de_DE": ["Bitte rufen Sie {name} unter {phone} zurück.", "Die Rechnung geht an {email}.",
              "Lieferadresse: {address}.", "Vielen Dank für Ihre Geduld."],
    "fr_FR": ["Merci de rappeler {name} au {phone}.", "Veuillez écrire à {email}.",
              "Adresse de livraison : {address}.", "Nous revenons vers vous rapidement."],
    "sv_SE": ["Ring {name} på {phone}.", "Skicka kvittot till {email}.", "Leveransadress: {address}.",
              "Tack för ditt tålamod."],
    "es_ES": ["Por favor, llame a {name} al {phone}.", "Envíe la factura a {email}.",
              "Dirección de entrega: {address}.", "Gracias por su paciencia."],
    "pl_PL": ["Proszę oddzwonić do {name} pod numer {phone}.", "Fakturę proszę wysłać na {email}.",
              "Adres dostawy: {address}.", "Dziękujemy za cierpliwość."],
}  # fmt: skip
PRODUCTS = ["router", "smart speaker", "e-reader", "fitness tracker", "printer", "phone app", "thermostat"]
SUBJECTS = ["Refund", "Question about my order", "Address change", "Login problem", "Invoice", "Re: your ticket"]
JOBS = ["data analyst", "nurse", "software engineer", "logistics coordinator", "teacher", "accountant"]
FIELDS = ["Economics", "Computer Science", "Biology", "Mechanical Engineering", "Linguistics"]
TRANSLIT = str.maketrans({"ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "ß": "ss", "æ": "ae", "Æ": "AE", "đ": "d"})


def ascii_part(text: str) -> str:
    """A name as an e-mail local part: ``Łukasz Zięcik`` → ``lukasz.ziecik`` pieces (lower-case ASCII)."""
    plain = unicodedata.normalize("NFKD", text.translate(TRANSLIT)).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "", plain.lower())


def phone_variant(fake: Any, rng: random.Random) -> str:
    number = str(fake.phone_number())
    roll = rng.random()
    if roll < 0.15:
        return re.sub(r"\s+", "", number)  # written without spaces
    if roll < 0.25:
        return re.sub(r"\s+", "-", number)
    return number


def slots(fake: Any, rng: random.Random, locale: str) -> dict[str, str]:
    first, last = str(fake.first_name()), str(fake.last_name())
    agent_first, agent_last = str(fake.first_name()), str(fake.last_name())
    domain = str(fake.free_email_domain() if rng.random() < 0.6 else fake.domain_name())
    local = rng.choice(
        [f"{ascii_part(first)}.{ascii_part(last)}", f"{ascii_part(first)[:1]}{ascii_part(last)}",
         f"{ascii_part(first)}{rng.randint(1, 99)}", f"{ascii_part(last)}_{ascii_part(first)}", str(fake.user_name())]
    )  # fmt: skip
    return {
        "name": f"{first} {last}",
        "first": first,
        "last": last,
        "agent": f"{agent_first} {agent_last}",
        "agent_first": agent_first,
        "other": f"{fake.first_name()} {fake.last_name()}",
        "email": f"{local}@{domain}",
        "email2": f"{ascii_part(str(fake.last_name()))}@{fake.domain_name()}",
        "phone": phone_variant(fake, rng),
        "address": ", ".join(p.strip() for p in str(fake.address()).split("\n")),
        "company": str(fake.company()),
        "city": str(fake.city()),
        "order": f"{rng.choice(['ORD-', '#', 'A'])}{rng.randint(10000, 999999)}",
        "ticket": str(rng.randint(1000, 99999)),
        "tracking": f"{rng.choice(['JJ', 'RR', 'LX'])}{rng.randint(10**8, 10**9 - 1)}{rng.choice(['SE', 'DE', 'PL'])}",
        "date": f"{rng.randint(1, 28)} {rng.choice(['March', 'April', 'May', 'June', 'October'])}",
        "time": f"{rng.randint(7, 19):02d}:{rng.choice(['00', '15', '30', '45', '05'])}",
        "time2": f"{rng.randint(20, 23):02d}:00",
        "amount": rng.choice(["€", "$", "£", "SEK ", "PLN "]) + f"{rng.randint(5, 900)}.{rng.randint(0, 99):02d}",
        "product": rng.choice(PRODUCTS),
        "subject": rng.choice(SUBJECTS),
        "version": f"{rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        "plan": rng.choice(["Basic", "Plus", "Business", "Family"]),
        "code": f"E{rng.randint(100, 999)}",
        "years": str(rng.randint(2, 15)),
        "job": rng.choice(JOBS),
        "field": rng.choice(FIELDS),
        "year": str(rng.randint(1995, 2022)),
        "languages": rng.choice(["English, German", "French, English", "Swedish, English", "Polish, English"]),
        "skill": rng.choice(["negotiation", "data visualisation", "budgeting", "team leadership"]),
    }


class Draft:
    """Text assembled piece by piece, recording where each piece of personal data lands."""

    def __init__(self) -> None:
        self.text = ""
        self.spans: list[tuple[int, int, str]] = []
        self.templates: frozenset[str] = frozenset()

    def add(self, template: str, values: dict[str, str], lower_names: bool = False) -> None:
        position = 0
        for match in SLOT.finditer(template):
            self.text += template[position : match.start()]
            key = match.group(1)
            value = values[key]
            label = LABELS.get(key)
            if label == "PERSON" and lower_names and key in ("first", "name"):
                value = value.lower()
            start = len(self.text)
            self.text += value
            if label is not None:
                self.spans.append((start, len(self.text), label))
            position = match.end()
        self.text += template[position:]


def compose(kind: str, rng: random.Random, values: dict[str, str], locale: str) -> Draft:
    draft = Draft()
    sep = " "
    if kind == "ticket":
        lines = [rng.choice(TICKET_OPEN), *rng.sample(TICKET_MORE, rng.randint(0, 4))]
    elif kind == "email":
        opening = rng.choice(EMAIL_OPEN)
        body = rng.sample(EMAIL_MORE, rng.randint(1, 4))
        lines, sep = [opening, " ".join(body), rng.choice(EMAIL_CLOSE)], "\n"
    elif kind == "chat":
        picks = sorted(rng.sample(range(len(CHAT_LINES)), rng.randint(2, 6)))
        minute = rng.randint(8 * 60, 20 * 60)
        lines, sep = [], "\n"
        for i in picks:  # each message a minute or two after the one before
            minute += rng.randint(0, 2)
            lines.append(CHAT_LINES[i].replace("{time}", f"{minute // 60:02d}:{minute % 60:02d}"))
    elif kind == "cv":
        header = rng.choice(["{name}\n{address} · {phone} · {email}", "{name}, {email}, {phone}", "CV of {name}."])
        lines = [header, *rng.sample(CV_MORE, rng.randint(1, 4))]
        sep = "\n"
    elif kind == "shipping":
        lines = [rng.choice(SHIP_OPEN), *rng.sample(SHIP_MORE, rng.randint(0, 3))]
    else:
        lines = rng.sample(NO_PII, rng.randint(1, 5))
    if locale in NATIVE and kind in ("ticket", "email", "shipping") and rng.random() < 0.35:
        lines.insert(rng.randint(1, len(lines)), rng.choice(NATIVE[locale]))
    lower = kind == "chat" and rng.random() < 0.4
    draft.templates = frozenset(re.sub(r"\[\d\d:\d\d\]", "", line) for line in lines)
    for n, line in enumerate(lines):
        if n:
            draft.add(sep, values)
        draft.add(line, values, lower_names=lower)
    return draft


KINDS = {"ticket": 0.22, "email": 0.2, "chat": 0.16, "cv": 0.1, "shipping": 0.14, "none": 0.18}


def too_close(kind: str, templates: frozenset[str], seen: set[Any], plain: list[frozenset[str]]) -> bool:
    """Whether a draft repeats an earlier one's sentences: the same set (in any order) for any kind, or half of
    them for texts without personal data (nothing else varies there), which prepare would drop as near-duplicates."""
    if (kind, templates) in seen:
        return True
    return kind == "none" and any(len(templates & t) * 2 >= len(templates | t) for t in plain)


def generate(count: int, seed: int) -> list[dict[str, Any]]:
    from faker import Faker

    rng = random.Random(seed)
    fakers = {locale: Faker(locale) for locale in LOCALES}
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    plain: list[frozenset[str]] = []
    draw = 0
    while len(rows) < count:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        for _ in range(50):  # redraw the same kind of text until it is not too close to an earlier one
            locale = rng.choice(LOCALES)
            fake = fakers[locale]
            fake.seed_instance(seed * 100_003 + draw)
            draw += 1
            draft = compose(kind, rng, slots(fake, rng, locale), locale)
            if not too_close(kind, draft.templates, seen, plain):
                break
        else:
            continue
        seen.add((kind, draft.templates))
        if kind == "none":
            plain.append(draft.templates)
        spans = [{"start": s, "end": e, "label": label, "text": draft.text[s:e]} for s, e, label in draft.spans]
        rows.append({"id": f"pii-{len(rows):04d}", "kind": kind, "locale": locale, "text": draft.text, "spans": spans})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SAMPLE)
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--any-faker", action="store_true", help="run with another Faker version (other output)")
    args = parser.parse_args()
    import faker

    if faker.VERSION != FAKER_VERSION and not args.any_faker:
        raise SystemExit(f"Faker {faker.VERSION} is installed; the shipped file was made with {FAKER_VERSION}")
    rows = generate(args.count, args.seed)
    with open(args.out, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(rows)} texts, {sum(len(r['spans']) for r in rows)} spans")


if __name__ == "__main__":
    main()
