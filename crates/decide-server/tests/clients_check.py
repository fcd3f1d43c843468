"""The openai and cohere Python SDKs, clients nobody here wrote, against `decide serve`.

Usage: python clients_check.py BASE_URL MODEL RERANKER

Embeds three texts in one request and the second alone, through the openai SDK
(`embeddings.create`, floats and base64), and reranks documents through the cohere SDK (its v2
client, and its v1 client with the documents returned). Prints what the SDKs parsed as one JSON
object on stdout; the Rust test `pydecide.rs` compares it with the embedded engine.
"""

import json
import sys

import cohere
import openai

BASE, MODEL, RERANKER = sys.argv[1], sys.argv[2], sys.argv[3]

TEXTS = [
    "Get weather forecast for a location.",
    "Send an email to a recipient with a subject and a body.",
    "Read the complete contents of a file from the file system.",
]
QUERY = "Will it rain in Berlin tomorrow?"

client = openai.OpenAI(base_url=BASE + "/v1", api_key="k3y")
batch = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
alone = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
# Without encoding_format the SDK asks for base64 and decodes it itself.
decoded = client.embeddings.create(model=MODEL, input=TEXTS)
try:
    client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=64)
    refused = None
except openai.BadRequestError as e:
    refused = e.body

v2 = cohere.ClientV2(api_key="k3y", base_url=BASE)
ranked_v2 = v2.rerank(model=RERANKER, query=QUERY, documents=TEXTS, top_n=2)
v1 = cohere.Client(api_key="k3y", base_url=BASE)
ranked_v1 = v1.rerank(model=RERANKER, query=QUERY, documents=TEXTS, return_documents=True)

print(
    json.dumps(
        {
            "batch": [d.embedding for d in batch.data],
            "indexes": [d.index for d in batch.data],
            "alone": alone.data[0].embedding,
            "base64": [d.embedding for d in decoded.data],
            "model": batch.model,
            "usage": [batch.usage.prompt_tokens, batch.usage.total_tokens],
            "refused": refused,
            "rerank_v2": [[r.index, r.relevance_score] for r in ranked_v2.results],
            "rerank_v1": [[r.index, r.relevance_score, r.document.text] for r in ranked_v1.results],
        }
    )
)
