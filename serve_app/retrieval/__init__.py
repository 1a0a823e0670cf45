"""Retrieval for vector stores and `file_search`: chunking by tokens, embeddings, the
index behind one interface (vectors and keywords, fused), attribute filters and the stores'
metadata. Imports `state` and `families` (tokenizers); the engines' embedding models plug in
through `embeddings.Embedder`. See docs/file-search.md."""
