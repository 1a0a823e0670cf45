"""Retrieval quality and the embedded index's speed, for vector stores and `file_search`.

    python -m bench.file_search [--chunks 10000] [--queries 500] [--dimensions 384]

1. Quality: recall@5 of hybrid vs semantic-only vs BM25-only (the index's `Ranking`
   weights) on a question set generated with known answers (`question_set`): documents
   about made-up things, each with a rare code name and a few facts; questions either name
   the code (keywords find them) or paraphrase the facts with other forms of the words
   (`migrating` for `migration`: the hashing embedder's character trigrams find them,
   BM25 does not). The embedding model is the hashing model (retrieval/embeddings.py).
2. Speed: ingest (chunks embedded and indexed per second, in files of 100 chunks) and search
   latency p50/p99 (hybrid, top 5) at `--chunks` chunks in one store.

Prints a table and ends with `recall_hybrid=... recall_semantic=... recall_bm25=...
ingest_chunks_per_s=... search_ms_p50=... search_ms_p99=...`; writes bench/results/file_search.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

_SYLLABLES = ["ka", "zu", "mor", "vel", "tri", "qua", "ron", "bex", "lio", "nar", "dex", "pho", "gri", "sul", "wen", "yot"]
# (document's verb, question's form of it), (document's noun, question's form)
_VERBS = [
    ("migrates", "migrating"),
    ("fermented", "fermenting"),
    ("calibrated", "calibration"),
    ("harvested", "harvesting"),
    ("navigates", "navigation"),
    ("insulated", "insulating"),
    ("purified", "purification"),
    ("excavated", "excavation"),
    ("irrigated", "irrigation"),
    ("sculpted", "sculpting"),
    ("distilled", "distilling"),
    ("forecasts", "forecasting"),
]
_NOUNS = [
    ("glaciers", "glacier"),
    ("orchards", "orchard"),
    ("telescopes", "telescope"),
    ("lanterns", "lantern"),
    ("bridges", "bridge"),
    ("turbines", "turbine"),
    ("vineyards", "vineyard"),
    ("reservoirs", "reservoir"),
    ("satellites", "satellite"),
    ("caverns", "cavern"),
    ("harbors", "harbor"),
    ("meadows", "meadow"),
]


@dataclass(frozen=True)
class Question:
    text: str
    answer: int  # the document that answers it


def question_set(documents: int = 300, seed: int = 7) -> tuple[list[str], list[Question]]:
    """Documents and questions with known answers (see the module's docstring), two per
    document: one names its code and nothing else it says; one paraphrases its facts with
    other forms of its words and shares no word with any document."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choice(_SYLLABLES) for _ in range(2)) + rng.choice(["ing", "ed", "s", "er"]) for _ in range(400)]
    docs: list[str] = []
    questions: list[Question] = []
    codes: set[str] = set()
    for number in range(documents):
        code = ""
        while not code or code in codes:
            code = "".join(rng.choice(_SYLLABLES) for _ in range(3))
        codes.add(code)
        (verb, verb_q), (verb2, verb2_q) = rng.sample(_VERBS, 2)
        (noun, noun_q), (noun2, noun2_q) = rng.sample(_NOUNS, 2)
        filler = " ".join(rng.choice(vocabulary) for _ in range(60))
        docs.append(f"{code} {verb} {noun} and {verb2} {noun2}. {filler}")
        questions.append(Question(f"Tell me about {code}.", number))
        questions.append(Question(f"Who was {verb_q} {noun_q} and {verb2_q} {noun2_q}?", number))
    return docs, questions


async def recall_at(k: int, documents: list[str], questions: list[Question], directory: Path) -> dict[str, float]:
    from serve_app.retrieval.embeddings import HashingEmbedder
    from serve_app.retrieval.index import EmbeddedIndex, IndexedChunk, Ranking

    embedder = HashingEmbedder()
    index = EmbeddedIndex(directory, embedder.dimensions)
    chunks = [IndexedChunk(f"file-{i}", f"doc{i}.txt", 0, text) for i, text in enumerate(documents)]
    await index.add("bench/vs_quality", chunks, embedder.embed_now(documents))
    rankings = {"hybrid": Ranking(), "semantic": Ranking(text_weight=0.0), "bm25": Ranking(embedding_weight=0.0)}
    recall: dict[str, float] = {}
    vectors = embedder.embed_now([q.text for q in questions])
    for name, ranking in rankings.items():
        found = 0
        for question, vector in zip(questions, vectors, strict=True):
            hits = await index.search("bench/vs_quality", question.text, vector, max_results=k, ranking=ranking)
            found += any(hit.file_id == f"file-{question.answer}" for hit in hits)
        recall[name] = found / len(questions)
    return recall


async def speed(chunks: int, queries: int, dimensions: int, directory: Path) -> dict[str, float]:
    from serve_app.retrieval.embeddings import HashingEmbedder
    from serve_app.retrieval.index import EmbeddedIndex, IndexedChunk, Ranking

    embedder = HashingEmbedder(dimensions)
    index = EmbeddedIndex(directory, dimensions)
    rng = random.Random(1)
    words = [w for pair in _VERBS + _NOUNS for w in pair] + ["".join(rng.choice(_SYLLABLES) for _ in range(3)) for _ in range(2000)]
    texts = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(chunks)]
    started = time.perf_counter()
    for first in range(0, chunks, 100):
        batch = texts[first : first + 100]
        file_chunks = [IndexedChunk(f"file-{first}", f"f{first}.txt", i, text) for i, text in enumerate(batch)]
        await index.add("bench/vs_speed", file_chunks, await embedder.embed(batch))
    ingest_s = time.perf_counter() - started
    await index.search("bench/vs_speed", "warm", embedder.embed_now(["warm"]), max_results=5, ranking=Ranking())  # builds BM25
    latencies = []
    for _ in range(queries):
        query = " ".join(rng.choice(words) for _ in range(6))
        started = time.perf_counter()
        await index.search("bench/vs_speed", query, await embedder.embed([query]), max_results=5, ranking=Ranking())
        latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    return {
        "chunks": chunks,
        "ingest_chunks_per_s": chunks / ingest_s,
        "search_ms_p50": statistics.median(latencies),
        "search_ms_p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--dimensions", type=int, default=384)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        documents, questions = question_set()
        recall = asyncio.run(recall_at(5, documents, questions, Path(tmp) / "quality"))
        figures = asyncio.run(speed(args.chunks, args.queries, args.dimensions, Path(tmp) / "speed"))
    print(f"{'ranking':<10} recall@5 ({len(questions)} questions, {len(documents)} documents)")
    for name, value in recall.items():
        print(f"{name:<10} {value:.3f}")
    print(
        f"ingest: {figures['ingest_chunks_per_s']:.0f} chunks/s; search at {args.chunks} chunks: p50 {figures['search_ms_p50']:.2f} ms, p99 {figures['search_ms_p99']:.2f} ms"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "file_search.json").write_text(json.dumps({"recall_at_5": recall, **figures}, indent=2) + "\n")
    print(
        f"recall_hybrid={recall['hybrid']:.3f} recall_semantic={recall['semantic']:.3f} recall_bm25={recall['bm25']:.3f} "
        f"ingest_chunks_per_s={figures['ingest_chunks_per_s']:.0f} search_ms_p50={figures['search_ms_p50']:.2f} "
        f"search_ms_p99={figures['search_ms_p99']:.2f}"
    )


if __name__ == "__main__":
    main()
