"""A source model's own Hugging Face tokenizer, its ids renumbered to mm-ds's embedding rows.

A RoBERTa directory without a SentencePiece model (roberta-base and most English RoBERTa models: a byte-level
BPE, vocab.json + merges.txt or tokenizer.json; XLM-R saved by transformers 5: tokenizer.json only) tokenizes
with its fast tokenizer, as `AutoTokenizer` loads it. Its ids are the embedding rows in the source's layout
(roberta-base: <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> last). An import moves the five specials to mm-ds's rows
0..4, the other rows keeping their order (interop.spm.our_layout), and writes the same tokenizer with its ids
renumbered alike (`write`): RUN/final/tokenizer.json. `mm-ds prepare` encodes MINIPOST's source text with it
(Step 1b), and Step 2's overlap initialisation reads its pieces, spelled as SentencePiece spells them
(mm_ds.data.tokenizer.pieces), so they compare with the target language's SentencePiece pieces.

Ids sit in the tokenizer's JSON in four places, all renumbered: the model's vocabulary (a piece -> id map, or
Unigram's list in id order), the added tokens, the post-processor's special tokens and the padding id.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..data.tokenizer import SPELLINGS, load_tokenizer_json, spelling
from ..tokens import SPECIAL_IDS, SPECIAL_PIECES
from .spm import InteropError

TOKENIZER_JSON = "tokenizer.json"


def load(src: Path):
    """The fast tokenizer of an HF directory (or a tokenizer.json file), as `AutoTokenizer` loads it."""
    if src.is_file():
        try:
            return load_tokenizer_json(src)
        except ValueError as e:
            raise InteropError(str(e)) from e
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise InteropError(f"{src} has no SentencePiece model; reading its Hugging Face tokenizer needs "
                           f"transformers (pip install transformers)") from e
    try:
        tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise InteropError(f"{src}: AutoTokenizer cannot load its tokenizer ({str(e).strip().splitlines()[0]}); "
                           f"a RoBERTa directory needs tokenizer.json, or vocab.json + merges.txt") from e
    if not getattr(tok, "is_fast", False):
        raise InteropError(f"{src}: AutoTokenizer gives a slow tokenizer ({type(tok).__name__}); mm-ds needs a "
                           f"fast one (tokenizer.json): save it with a transformers that converts it")
    return tok.backend_tokenizer


def rows_of(tok, vocab_size: int, weights: str, where: Path) -> list[str]:
    """The piece of every embedding row: the tokenizer's ids, checked against the weights. Refused: ids with
    gaps, a size other than the rows', RoBERTa's special tokens missing, a spelling mm-ds cannot compare."""
    by_id = {i: p for p, i in tok.get_vocab(with_added_tokens=True).items()}
    n = len(by_id)
    if sorted(by_id) != list(range(n)):
        raise InteropError(f"{where}: the tokenizer's ids are not 0..{n - 1} without gaps")
    if n != vocab_size:
        raise InteropError(f"{where}: the tokenizer has {n} tokens but {weights} has {vocab_size} rows: the "
                           f"tokenizer belongs to another model")
    rows = [by_id[i] for i in range(n)]
    missing = [p for p in SPECIAL_PIECES if p not in by_id.values()]
    if missing:
        raise InteropError(f"{where}: the tokenizer has no {', '.join(missing)}; mm-ds takes RoBERTa-family "
                           f"models, whose special tokens are {' '.join(SPECIAL_PIECES)}")
    if spelling(json.loads(tok.to_str())) is None:
        decoder = (json.loads(tok.to_str()).get("decoder") or {}).get("type")
        raise InteropError(f"{where}: the tokenizer's decoder {decoder!r} is not one whose pieces mm-ds can compare "
                           f"with a SentencePiece vocabulary (overlap initialisation): {', '.join(SPELLINGS)}")
    return rows


def _renumber(node, new: list[int]):
    """The post-processor (any nesting) with every special token's id renumbered."""
    if isinstance(node, list):
        return [_renumber(x, new) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _renumber(v, new) for k, v in node.items()}
    for key in ("sep", "cls"):  # RobertaProcessing, BertProcessing: [token, id]
        if isinstance(node.get(key), list) and len(node[key]) == 2:
            out[key] = [node[key][0], new[node[key][1]]]
    if isinstance(node.get("ids"), list) and "tokens" in node:  # TemplateProcessing's special_tokens entries
        out["ids"] = [new[i] for i in node["ids"]]
    return out


def write(tok, perm: list[int], out: Path, texts: list[str]) -> dict:
    """Write `tok` with new id j for old id perm[j] (`perm`: from spm.our_layout) to `out`, and check that it
    encodes `texts` as `tok` does up to that renumbering. Returns counts for the import report."""
    new = [0] * len(perm)
    for j, i in enumerate(perm):
        new[i] = j
    by_id = {i: p for p, i in tok.get_vocab(with_added_tokens=True).items()}
    spec = json.loads(tok.to_str())
    model = spec["model"]
    # The model's vocabulary holds every row, added tokens (roberta-base's <mask>) included: `tokenizers` numbers
    # an added token the model lacks after the model's own, which <mask> at row 4 would not be.
    if isinstance(model.get("vocab"), dict):  # BPE, WordPiece, WordLevel
        model["vocab"] = {by_id[i]: j for j, i in enumerate(perm)}
    elif isinstance(model.get("vocab"), list):  # Unigram: [piece, score] in id order
        scores = dict(map(tuple, model["vocab"]))
        floor = min(scores.values())  # never chosen for text: an added token is matched before the model runs
        model["vocab"] = [[by_id[i], scores.get(by_id[i], floor)] for i in perm]
        if model.get("unk_id") is not None:
            model["unk_id"] = new[model["unk_id"]]
    else:
        raise InteropError(f"{out}: tokenizer model {model.get('type')!r} has no vocabulary mm-ds can renumber")
    for t in spec.get("added_tokens") or []:
        t["id"] = new[t["id"]]
    spec["post_processor"] = _renumber(spec.get("post_processor"), new)
    if spec.get("padding"):
        spec["padding"]["pad_id"] = new[spec["padding"]["pad_id"]]
    from tokenizers import Tokenizer

    renumbered = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    for text in texts:
        want = [new[i] for i in tok.encode(text).ids]
        got = renumbered.encode(text).ids
        if got != want:
            raise InteropError(f"internal: the renumbered tokenizer encodes {text!r} as {got}, not {want}")
    if [renumbered.token_to_id(p) for p in SPECIAL_PIECES] != list(SPECIAL_IDS):
        raise InteropError(f"internal: the renumbered tokenizer {out} does not have mm-ds's special ids")
    renumbered.save(str(out))
    return {"pieces": len(perm), "kind": model.get("type"), "decoder": (spec.get("decoder") or {}).get("type")}


def sample_texts(tok, lines: int = 32) -> list[str]:
    """Text made of the tokenizer's own pieces (runs of them, across word boundaries), to check a conversion on."""
    n = tok.get_vocab_size(with_added_tokens=True)
    step = max(1, (n - len(SPECIAL_IDS)) // lines)
    return [tok.decode(list(range(i, min(i + 2 * step, n)))) for i in range(len(SPECIAL_IDS), n, step)]
