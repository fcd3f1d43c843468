"""pydecide 0.2.19, a client nobody here wrote, against `decide serve`.

Usage: python pydecide_check.py BASE_URL

Points pydecide's System One backend (TypeSafeBackend, base URL + /v1/systemone) and its
OpenAI Decisions backend (OpenAIDecisionsBackend, base URL + /v1 + /decisions) at the server,
asks both the same questions through pydecide's Client, and prints what pydecide parsed as one
JSON object on stdout. The Rust test `pydecide.rs` compares it with the embedded engine.
"""

import json
import sys

from decide import Choice, Client, Noul, Score
from decide.backends.openai_decisions import OpenAIDecisionsBackend
from decide.backends.typesafe import TypeSafeBackend

STATE = "My flight to Lisbon was cancelled this morning and I want my money back"

QUESTIONS = {
    "refund": Noul(
        "Does the user want their money back?",
        {"true": "the user asks for a refund", "false": "the user asks for something else"},
    ),
    "urgent": Noul("Does the user need help today?"),
    "team": Choice(
        "Which team should handle this?",
        {
            "payments": "Refunds and payments",
            "bookings": None,
            "lost-luggage": "Bags that did not arrive",
        },
    ),
    "urgency": Score("How urgent is it?", ["low", "medium", "high"]),
}


def answers(response):
    out = {}
    for name, answer in response.answers.items():
        if hasattr(answer, "noul"):
            out[name] = {"noul": answer.noul}
        elif hasattr(answer, "choice"):
            out[name] = {"choice": answer.choice, "probabilities": dict(answer.probabilities)}
        else:
            out[name] = {"score": answer.score, "probabilities": list(answer.probabilities)}
    return out


def main():
    base = sys.argv[1].rstrip("/")
    backends = {
        "systemone": TypeSafeBackend("local-key", base_url=base),
        "openai": OpenAIDecisionsBackend("local-key", base_url=base + "/v1"),
    }
    result = {}
    for name, backend in backends.items():
        # One backend, no escalation: whatever the server answers is the answer.
        client = Client([backend], on_low_confidence="accept")
        response = client.decide(STATE, QUESTIONS)
        result[name] = {
            "backend": response.meta.backend,
            "model": response.meta.model,
            "answers": answers(response),
        }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
