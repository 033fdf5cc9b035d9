"""Small tokenizer vocabularies for the synthetic GGUF fixtures.

Two kinds, as llama.cpp's converter writes them:
- `gpt2` byte-level BPE (`bpe_vocab`): 256 byte tokens in GPT-2's byte-to-unicode order, the results of merges
  learned on CORPUS, and the family's special tokens (at the start, as SmolLM has them, or at the end, as Llama 3 and
  Qwen have them).
- `llama` SentencePiece-style (`spm_vocab`): special tokens, 256 `<0xNN>` byte-fallback tokens, single characters and
  merged pieces with `▁` for spaces and a score per piece (higher = merged earlier).

Everything is deterministic: merge ties break on the lexicographically smallest pair.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

# gguf token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Training text for the merges, written for these fixtures: plain English prose, a little code, numbers and
# punctuation, so that the learned pieces look like a real tokenizer's first few hundred merges.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog did not mind; it was a warm afternoon and the sun was high.
Once upon a time there was a small village by the river. People in the village worked in the fields all day,
and in the evening they sat together and told stories about the mountains, the forest and the old castle.
A model reads a sequence of tokens and predicts the next one. Each layer mixes information between positions
with attention, and then transforms every position on its own with a feed-forward network.
When the weights are quantized, every block of numbers shares one scale, and the values are stored in four,
five, six or eight bits. This saves memory and makes the model faster on ordinary computers.
She said that she would come back tomorrow, but nobody believed her. "We will see," he answered with a smile.
It's not what you think: they're here, we've seen them, and I'll tell you what I'd do if I were you.
There are 365 days in a year, 24 hours in a day and 60 minutes in an hour. In 2024 the price was 19.99 dollars.
The results were clear: 87 percent of the students passed the test, and the average score was 72.5 points.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 2))

if (x > 0 && y < 10) { return x * y; } else { return -1; }
Questions are important. Why is the sky blue? How does a computer work? What is the meaning of this word?
Good morning! How are you today? I am fine, thank you. Let us meet at the station at half past seven.
The history of science is full of surprising discoveries, careful measurements and long arguments.
Water boils at one hundred degrees, and ice melts when the temperature rises above zero.
Many hands make light work, and a journey of a thousand miles begins with a single step.
Please write a short summary of the following text, then answer the question at the end in one sentence.
The cat sat on the mat. The bird sang in the tree. The children played in the garden until it was dark.
Reading, writing and counting are the first things that every school teaches to its youngest students.
"""

_TRAIN_SPLIT = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable bytes map to themselves, the rest above 255)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return {b: out[b] for b in keep + [b for b in range(256) if b not in keep]}


def learn_merges(words: Counter[tuple[str, ...]], n_merges: int) -> list[tuple[str, str]]:
    """Classic BPE: repeatedly merge the most frequent adjacent pair (ties: smallest pair)."""
    words = Counter({w: c for w, c in words.items() if len(w) > 0})
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best_count = max(pairs.values())
        best = min(p for p, c in pairs.items() if c == best_count)
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for w, c in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return merges


@dataclass
class Vocab:
    """One tokenizer as written to `tokenizer.ggml.*`."""

    model: str  # "gpt2" or "llama"
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    special_ids: dict[str, int] = field(default_factory=dict)  # bos/eos/unk/pad/... -> id
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None

    def id_of(self, text: str) -> int:
        return self.tokens.index(text)

    def normal_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.types) if t == NORMAL]


def bpe_vocab(n_vocab: int, pre: str, specials_front: list[tuple[str, int]],
              specials_back: list[tuple[str, int]]) -> Vocab:
    """A gpt2-style byte-level BPE vocabulary of exactly n_vocab tokens."""
    b2u = bytes_to_unicode()
    byte_tokens = list(b2u.values())
    n_merges = n_vocab - len(specials_front) - len(specials_back) - len(byte_tokens)
    assert n_merges > 0, "vocabulary too small"
    words: Counter[tuple[str, ...]] = Counter()
    for piece in _TRAIN_SPLIT.findall(CORPUS):
        words[tuple(b2u[b] for b in piece.encode("utf-8"))] += 1
    merges = learn_merges(words, n_merges)
    assert len(merges) == n_merges, f"corpus gives only {len(merges)} merges, need {n_merges}"
    tokens = [t for t, _ in specials_front] + byte_tokens + [a + b for a, b in merges] + [t for t, _ in specials_back]
    types = [ty for _, ty in specials_front] + [NORMAL] * (len(byte_tokens) + len(merges)) + \
        [ty for _, ty in specials_back]
    assert len(set(tokens)) == len(tokens) == n_vocab
    return Vocab(model="gpt2", pre=pre, tokens=tokens, types=types, merges=[f"{a} {b}" for a, b in merges])


def spm_vocab(n_vocab: int, specials_front: list[tuple[str, int]], specials_back: list[tuple[str, int]]) -> Vocab:
    """A SentencePiece-style vocabulary (scores, byte fallback) of exactly n_vocab tokens."""
    units: Counter[tuple[str, ...]] = Counter()
    for line in CORPUS.splitlines():
        text = "▁" + line.replace(" ", "▁")
        for unit in re.findall(r"▁*[^▁]+|▁+", text):
            units[tuple(unit)] += 1
    chars = sorted({c for u in units for c in u})
    n_fixed = len(specials_front) + 256 + len(chars) + len(specials_back)
    n_merges = n_vocab - n_fixed
    assert n_merges > 0, "vocabulary too small"
    merges = learn_merges(units, n_merges)
    assert len(merges) == n_merges, f"corpus gives only {len(merges)} merges, need {n_merges}"
    tokens = [t for t, _ in specials_front] + [f"<0x{b:02X}>" for b in range(256)]
    types = [ty for _, ty in specials_front] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for rank, (a, b) in enumerate(merges):
        tokens.append(a + b)
        types.append(NORMAL)
        scores.append(-float(rank))
    for i, c in enumerate(chars):
        tokens.append(c)
        types.append(NORMAL)
        scores.append(-float(n_merges + i))
    for t, ty in specials_back:
        tokens.append(t)
        types.append(ty)
        scores.append(-1000.0 if ty == USER_DEFINED else 0.0)
    assert len(set(tokens)) == len(tokens) == n_vocab, "duplicate pieces"
    return Vocab(model="llama", pre="default", tokens=tokens, types=types, scores=scores)


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim"
    " + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content']"
    " + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
# a harmony-like template (gpt-oss's own is far longer: channels, tools, a system preamble)
HARMONY_TEMPLATE = (
    "{% for message in messages %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def family_vocab(kind: str, n_vocab: int) -> Vocab:
    """The tokenizer of one fixture family, shaped like the real family's converted GGUF."""
    if kind == "smollm":  # SmolLM2: specials first, bos <|im_start|>, eos <|im_end|>, no BOS added
        v = bpe_vocab(n_vocab, "smollm", [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL),
                                          ("<|im_end|>", CONTROL), ("<repo_name>", CONTROL), ("<file_sep>", CONTROL)], [])
        v.special_ids = {"bos": 1, "eos": 2, "unk": 0, "pad": 2}
        v.add_bos, v.add_space_prefix, v.chat_template = False, False, CHATML_TEMPLATE
    elif kind == "llama3":  # Llama 3.x: specials last, BOS added
        back = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                "<|python_tag|>"]
        v = bpe_vocab(n_vocab, "llama-bpe", [], [(t, CONTROL) for t in back])
        v.special_ids = {"bos": v.id_of("<|begin_of_text|>"), "eos": v.id_of("<|eot_id|>")}
        v.add_bos, v.chat_template = True, LLAMA3_TEMPLATE
    elif kind in ("qwen2", "qwen3"):  # Qwen 2.5 / 3: specials last, no BOS; Qwen3's <think> is not special
        back = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL)]
        if kind == "qwen3":
            back += [("<think>", USER_DEFINED), ("</think>", USER_DEFINED)]
        v = bpe_vocab(n_vocab, "qwen2", [], back)
        v.special_ids = {"eos": v.id_of("<|im_end|>"), "pad": v.id_of("<|endoftext|>"),
                         "bos": v.id_of("<|endoftext|>")}
        v.add_bos, v.chat_template = False, CHATML_TEMPLATE
    elif kind == "gpt-oss":  # o200k_harmony: specials last, pre-tokenizer gpt-4o, no BOS added
        back = [("<|startoftext|>", CONTROL), ("<|endoftext|>", CONTROL), ("<|return|>", CONTROL),
                ("<|constrain|>", CONTROL), ("<|channel|>", CONTROL), ("<|start|>", CONTROL), ("<|end|>", CONTROL),
                ("<|message|>", CONTROL), ("<|call|>", CONTROL)]
        v = bpe_vocab(n_vocab, "gpt-4o", [], back)
        v.special_ids = {"bos": v.id_of("<|startoftext|>"), "eos": v.id_of("<|return|>"),
                         "pad": v.id_of("<|endoftext|>")}
        v.add_bos, v.chat_template = False, HARMONY_TEMPLATE
    elif kind == "tinyllama":  # Llama 2 style SentencePiece: <unk> <s> </s>, bytes, pieces
        v = spm_vocab(n_vocab, [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)], [])
        v.special_ids = {"bos": 1, "eos": 2, "unk": 0}
        v.add_bos, v.add_eos = True, False
    elif kind == "mistral":  # Mistral v0.3: control tokens [INST] [/INST] right after </s>
        v = spm_vocab(n_vocab, [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("[INST]", CONTROL),
                                ("[/INST]", CONTROL)], [])
        v.special_ids = {"bos": 1, "eos": 2, "unk": 0}
        v.add_bos, v.add_eos, v.chat_template = True, False, MISTRAL_TEMPLATE
    elif kind == "gemma3":  # Gemma 3: <pad> <eos> <bos> <unk> first, no space prefix
        v = spm_vocab(n_vocab, [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
                                ("<mask>", CONTROL), ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL)], [])
        v.special_ids = {"bos": 2, "eos": 1, "unk": 3, "pad": 0}
        v.add_bos, v.add_eos, v.add_space_prefix, v.chat_template = True, False, False, GEMMA_TEMPLATE
    elif kind == "phi3":  # Phi-3: SentencePiece plus added chat tokens at the end, no BOS added
        v = spm_vocab(n_vocab, [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)],
                      [("<|endoftext|>", CONTROL), ("<|assistant|>", USER_DEFINED), ("<|system|>", USER_DEFINED),
                       ("<|end|>", USER_DEFINED), ("<|user|>", USER_DEFINED)])
        v.special_ids = {"bos": 1, "eos": v.id_of("<|endoftext|>"), "unk": 0, "pad": v.id_of("<|endoftext|>")}
        v.add_bos, v.add_eos, v.chat_template = False, False, PHI3_TEMPLATE
    else:
        raise ValueError(f"unknown vocab kind {kind}")
    return v


def write_vocab(w, v: Vocab) -> None:
    """Writes the tokenizer keys in the order the converter does (model, pre, tokens, scores, types, merges,
    special ids, add_* flags, chat template)."""
    w.add_tokenizer_model(v.model)
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    if v.scores is not None:
        w.add_token_scores(v.scores)
    w.add_token_types(v.types)
    if v.merges is not None:
        w.add_token_merges(v.merges)
    for kind, tid in v.special_ids.items():
        getattr(w, f"add_{kind}_token_id")(tid)
    if v.add_bos is not None:
        w.add_add_bos_token(v.add_bos)
    if v.add_eos is not None:
        w.add_add_eos_token(v.add_eos)
    if v.add_space_prefix is not None:
        w.add_add_space_prefix(v.add_space_prefix)
    if v.chat_template is not None:
        w.add_chat_template(v.chat_template)
