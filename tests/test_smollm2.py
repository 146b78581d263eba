"""The real packaged default model, smollm2-135m (slow tier: `make test-slow`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

REQUEST = {
    "state": "Checkout returns HTTP 500 for every customer since 09:10. The status page still says all green.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {
                "billing": "Charges, invoices and refunds",
                "engineering": "Bugs, errors and outages",
                "support": "How-to and account questions",
            },
        },
        "outage": {"type": "noul", "instructions": "Is a production system down?"},
        "urgency": {
            "type": "score",
            "instructions": "How urgent is it?",
            "criteria": ["not urgent", "soon", "today", "blocking"],
        },
    },
}


def test_smollm2_loads_with_single_token_labels_and_answers_a_request(packaged_smollm2: str) -> None:
    from mydecide.modeling import load_model
    from mydecide.serving.request import parse_request
    from mydecide.serving.response import answer_request

    model = load_model("smollm2-135m", device="cpu")
    renderer = model.renderer
    assert renderer.label_form == "A"  # ChatML puts the answer right after "assistant\n": no leading space
    assert len(set(renderer.label_ids)) == 26
    assert [model.tokenizer.decode([i]) for i in renderer.label_ids[:3]] == ["A", "B", "C"]
    assert renderer.head.startswith("<|im_start|>system\n") and renderer.tail.endswith("<|im_start|>assistant\n")

    response = answer_request(model, parse_request(REQUEST))
    team, outage, urgency = (response["answers"][n] for n in ("team", "outage", "urgency"))
    assert sum(team["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert sum(urgency["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
    assert 0.0 < outage["noul"] < 1.0
    alone = answer_request(model, parse_request(REQUEST), shared_prefix=False)
    for option, p in team["probabilities"].items():
        assert alone["answers"]["team"]["probabilities"][option] == pytest.approx(p, abs=1e-4)
    assert alone["answers"]["outage"]["noul"] == pytest.approx(outage["noul"], abs=1e-4)


def test_smollm2_tokenizes_whitespace_before_a_digit_as_llama_cpp_does(packaged_smollm2: str) -> None:
    """Its GGUF says ``tokenizer.ggml.pre = smollm``: digits are split off first, so whitespace before one stays one
    token (ids as llama-server's /tokenize gives them on the packaged file)."""
    from mydecide.modeling import load_model

    tokenizer = load_model("smollm2-135m", device="cpu").tokenizer
    assert tokenizer("ok\n\n1) yes", add_special_tokens=False)["input_ids"] == [2231, 1116, 33, 25, 9805]
    assert tokenizer.convert_ids_to_tokens(tokenizer("Total:  12")["input_ids"]) == ["Total", ":", "ĠĠ", "1", "2"]
