"""Retrieval quality and speed of both indexes, for vector stores and `file_search`: the
embedded one (usearch + bm25s in a directory) and the server one (PostgreSQL with pgvector,
started by the `pgserver` wheel as the tests start it), side by side in one run.

    python -m bench.file_search [--chunks 10000] [--queries 500] [--dimensions 384]

1. Quality: recall@5 of hybrid vs semantic-only vs keyword-only (the index's `Ranking`
   weights; keywords: BM25 in the embedded index, the IDF of the words looked up through its
   GIN index in pgvector) on a question set generated with known answers (`question_set`):
   documents about made-up things, each with a rare code name and a few facts; questions
   either name the code (keywords find them) or paraphrase the facts with other forms of the
   words (`migrating` for `migration`: the hashing embedder's character trigrams find them,
   keywords do not).
   The embedding model is the hashing model (retrieval/embeddings.py).
2. Speed: ingest (chunks indexed per second, in files of 100 chunks, each file's vectors
   computed once and added to both indexes in turn: the index's own time; the hashing
   model's time is reported apart) and search latency p50/p99 (hybrid, top 5, both indexes
   queried in turn with the same queries) at `--chunks` chunks in one store.

Prints a table with the pgvector/embedded ratios and ends with one line of `name=value`
figures; writes bench/results/file_search.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serve_app.retrieval.index import VectorIndex

RESULTS = Path(__file__).parent / "results"
INDEXES = ("embedded", "pgvector")
RANKINGS = ("hybrid", "semantic", "keyword")

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


async def recall_at(k: int, documents: list[str], questions: list[Question], index: VectorIndex) -> dict[str, float]:
    """recall@k of each ranking (hybrid, semantic only, keywords only) with `index` (empty,
    of the hashing model's default dimensions)."""
    from serve_app.retrieval.embeddings import HashingEmbedder
    from serve_app.retrieval.index import IndexedChunk, Ranking

    embedder = HashingEmbedder()
    chunks = [IndexedChunk(f"file-{i}", f"doc{i}.txt", 0, text) for i, text in enumerate(documents)]
    await index.add("bench/vs_quality", chunks, embedder.embed_now(documents))
    rankings = {"hybrid": Ranking(), "semantic": Ranking(text_weight=0.0), "keyword": Ranking(embedding_weight=0.0)}
    recall: dict[str, float] = {}
    vectors = embedder.embed_now([q.text for q in questions])
    for name, ranking in rankings.items():
        found = 0
        for question, vector in zip(questions, vectors, strict=True):
            hits = await index.search("bench/vs_quality", question.text, vector, max_results=k, ranking=ranking)
            found += any(hit.file_id == f"file-{question.answer}" for hit in hits)
        recall[name] = found / len(questions)
    await index.aclose()
    return recall


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def speed(chunks: int, queries: int, dimensions: int, indexes: dict[str, VectorIndex]) -> dict[str, dict[str, float]]:
    """Ingest and search figures of each index (same chunks, same vectors, same queries, taken
    in turn so that a noisy machine weighs on each alike), and the hashing model's rate."""
    from serve_app.retrieval.embeddings import HashingEmbedder
    from serve_app.retrieval.index import IndexedChunk, Ranking

    embedder = HashingEmbedder(dimensions)
    rng = random.Random(1)
    words = [w for pair in _VERBS + _NOUNS for w in pair] + ["".join(rng.choice(_SYLLABLES) for _ in range(3)) for _ in range(2000)]
    texts = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(chunks)]
    embed_s, add_s = 0.0, dict.fromkeys(indexes, 0.0)
    for first in range(0, chunks, 100):
        batch = texts[first : first + 100]
        file_chunks = [IndexedChunk(f"file-{first}", f"f{first}.txt", i, text) for i, text in enumerate(batch)]
        started = time.perf_counter()
        vectors = await embedder.embed(batch)
        embed_s += time.perf_counter() - started
        for name, index in indexes.items():
            started = time.perf_counter()
            await index.add("bench/vs_speed", file_chunks, vectors)
            add_s[name] += time.perf_counter() - started
    for index in indexes.values():  # the embedded index builds its BM25 at the first search
        await index.search("bench/vs_speed", "warm", embedder.embed_now(["warm"]), max_results=5, ranking=Ranking())
    latencies: dict[str, list[float]] = {name: [] for name in indexes}
    for _ in range(queries):
        query = " ".join(rng.choice(words) for _ in range(6))
        for name, index in indexes.items():
            started = time.perf_counter()
            await index.search("bench/vs_speed", query, await embedder.embed([query]), max_results=5, ranking=Ranking())
            latencies[name].append((time.perf_counter() - started) * 1000)
    for index in indexes.values():
        await index.aclose()
    figures: dict[str, dict[str, float]] = {"hashing": {"embed_chunks_per_s": chunks / embed_s}}
    for name in indexes:
        figures[name] = {
            "chunks": chunks,
            "ingest_chunks_per_s": chunks / add_s[name],
            "search_ms_p50": statistics.median(latencies[name]),
            "search_ms_p99": _p99(latencies[name]),
        }
    return figures


def run(chunks: int, queries: int, dimensions: int, pg_url: str, directory: Path, documents: int = 300) -> dict:
    """Both measurements on both indexes: the embedded one in `directory`, pgvector at `pg_url`
    (the question set of `documents` documents)."""
    from serve_app.retrieval.embeddings import HashingEmbedder
    from serve_app.retrieval.index import EmbeddedIndex
    from serve_app.retrieval.pgvector import PgVectorIndex

    makers: dict[str, Callable[[str, int], VectorIndex]] = {
        "embedded": lambda name, d: EmbeddedIndex(directory / name, d),
        "pgvector": lambda name, d: PgVectorIndex(pg_url, d, table=f"bench_{name}"),
    }
    texts, questions = question_set(documents)
    quality = {
        name: asyncio.run(recall_at(5, texts, questions, make("quality", HashingEmbedder().dimensions))) for name, make in makers.items()
    }
    figures = asyncio.run(speed(chunks, queries, dimensions, {name: make("speed", dimensions) for name, make in makers.items()}))
    return {"questions": len(questions), "documents": len(texts), "recall_at_5": quality, **figures}


def report(results: dict) -> list[str]:
    """The table's lines, then the `name=value` line."""
    recall, embedded, pgvector = results["recall_at_5"], results["embedded"], results["pgvector"]
    lines = [
        f"recall@5 ({results['questions']} questions, {results['documents']} documents)",
        f"{'ranking':<10} {'embedded':>9} {'pgvector':>9}",
    ]
    lines += [f"{name:<10} {recall['embedded'][name]:>9.3f} {recall['pgvector'][name]:>9.3f}" for name in RANKINGS]
    lines.append(f"at {embedded['chunks']} chunks {'embedded':>12} {'pgvector':>9} {'ratio':>6}")
    for key, label in (("ingest_chunks_per_s", "ingest/s"), ("search_ms_p50", "p50 ms"), ("search_ms_p99", "p99 ms")):
        lines.append(f"{label:<22} {embedded[key]:>9.2f} {pgvector[key]:>9.2f} {pgvector[key] / embedded[key]:>6.2f}")
    lines.append(f"(the hashing model: {results['hashing']['embed_chunks_per_s']:.0f} chunks/s, apart)")
    values = {f"{index}_recall_{name}": f"{recall[index][name]:.3f}" for index in INDEXES for name in RANKINGS}
    for index, figures in (("embedded", embedded), ("pgvector", pgvector)):
        values[f"{index}_ingest_chunks_per_s"] = f"{figures['ingest_chunks_per_s']:.0f}"
        values[f"{index}_search_ms_p50"] = f"{figures['search_ms_p50']:.2f}"
        values[f"{index}_search_ms_p99"] = f"{figures['search_ms_p99']:.2f}"
    values["embed_chunks_per_s"] = f"{results['hashing']['embed_chunks_per_s']:.0f}"
    lines.append(" ".join(f"{key}={value}" for key, value in values.items()))
    return lines


def main() -> None:
    from tests.support.postgres_server import postgres

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--dimensions", type=int, default=384)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, postgres() as pg_url:
        results = run(args.chunks, args.queries, args.dimensions, pg_url, Path(tmp))
    print("\n".join(report(results)))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "file_search.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
