"""Cross-request retrieval corpus: recent outputs of all requests, in SGLang's own n-gram trie (`NgramCorpus`,
sglang.srt.speculative.cpp_ngram, C++ compiled on first use), used as a library.

What we adapt: the trie is fed each request's newly committed output in windows (not the last few tokens of the
prompt as SGLang's NGRAM worker does: prompts are the per-request lookup's job); its BFS result is a tree, so
breadth 1 makes it one chain; slot 0 echoes the last committed token and empty slots are padded with token 0,
ambiguous with a real token 0, so the chain's length is read from the tree mask, not from the ids. The trie holds
at most `capacity` nodes and evicts the least recently used ones itself.
"""

from __future__ import annotations

import logging

import numpy as np

from sglang_dspark.retrieval import Candidate

logger = logging.getLogger(__name__)

MATCH_DEPTH = 12  # longest suffix of a request's context the trie is queried with
INSERT_WINDOW = 64  # output tokens per insertion (plus MATCH_DEPTH of overlap, so no n-gram is cut)


class OutputCorpus:
    def __init__(self, gamma: int, capacity: int = 500_000):
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        self.gamma = gamma
        self._trie = NgramCorpus(max_trie_depth=MATCH_DEPTH + gamma, min_bfs_breadth=1, max_bfs_breadth=1,
                                 draft_token_num=gamma + 1, match_type="BFS", capacity=capacity)
        self._inserted: dict[str, int] = {}  # rid -> output tokens already inserted
        self._live: dict[str, object] = {}  # rid -> req of the last batch seen
        self._pending = False

    @classmethod
    def create(cls, gamma: int) -> "OutputCorpus | None":
        """None, with the reason logged, where SGLang's n-gram extension cannot be built or loaded."""
        try:
            return cls(gamma)
        except Exception as e:  # a missing compiler / ninja must not stop the server: the corpus source is off
            logger.warning("DSPARK_EXT: cross-request retrieval corpus unavailable (%s: %s); prompt lookup only",
                           type(e).__name__, e)
            return None

    def add_outputs(self, reqs) -> None:
        """Insert each request's output committed since its last insertion, once a window of it has grown, and the
        rest of every request that left the batch since the last call (finished, aborted or retracted)."""
        batch = []
        live = {}
        for req in reqs:
            live[req.rid] = req
            if len(req.output_ids) - self._inserted.get(req.rid, 0) >= INSERT_WINDOW:
                batch.append(self._new_tokens(req))
        gone = [rid for rid in self._live if rid not in live]
        for rid in gone:
            req = self._live[rid]
            if len(req.output_ids) > self._inserted.get(rid, 0):
                batch.append(self._new_tokens(req))
            self._inserted.pop(rid, None)
        if gone:
            self._trie.erase_match_state(gone)
        self._live = live
        if batch:
            self._trie.batch_put(batch)
            self._pending = True

    def _new_tokens(self, req) -> list[int]:
        out = req.output_ids
        start = max(0, self._inserted.get(req.rid, 0) - MATCH_DEPTH)
        self._inserted[req.rid] = len(out)
        return [int(t) for t in out[start:]]

    def candidates(self, rids, contexts) -> list[Candidate | None]:
        """Per request: the corpus chain after its context's last token (None when the trie has no match)."""
        if not rids:
            return []
        if self._pending:
            self._trie.synchronize()
            self._pending = False
        tails = [[int(t) for t in ctx[-MATCH_DEPTH:]] for ctx in contexts]
        ids, mask = self._trie.batch_get(list(rids), tails, [len(ctx) for ctx in contexts])
        return chains_from_trie(np.asarray(ids), np.asarray(mask), len(rids), self.gamma + 1)


def chains_from_trie(ids: np.ndarray, mask: np.ndarray, n: int, width: int) -> list[Candidate | None]:
    """NgramCorpus.batch_get output (ids[n * width], tree mask[n * width * width]) of breadth 1 -> one chain per
    request: slot j belongs to the chain while row j of the mask sees exactly slots 0..j. Padding slots hang off
    slot 0 with token 0, so slot 1 alone is ambiguous: a lone token 0 there is read as no match."""
    from sglang_dspark.sglang_plugin.stats import SOURCE_CORPUS

    ids = ids.reshape(n, width)
    mask = mask.reshape(n, width, width).astype(bool)
    lower = np.tril(np.ones((width, width), dtype=bool))
    out: list[Candidate | None] = []
    for r in range(n):
        length = 0
        for j in range(1, width):
            if not (mask[r, j] == lower[j]).all():
                break
            length = j
        if length == 1 and int(ids[r, 1]) == 0:
            length = 0
        # the trie exports no match length: the chain's own length stands in for it (a deeper path, more evidence)
        out.append(Candidate(tokens=ids[r, 1: 1 + length].astype(np.int64), match_len=length, count=0,
                             source=SOURCE_CORPUS) if length else None)
    return out
