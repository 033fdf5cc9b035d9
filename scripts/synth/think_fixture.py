#!/usr/bin/env python3
"""Writes qwen3-think-s-f16.gguf next to the synthetic fixtures: qwen3-s-f16.gguf (its weights, vocabulary and
metadata unchanged, so llama.cpp's recorded logits for it hold) with a chat template that thinks in `<think>`
blocks as DeepSeek R1's and Qwen3's do: the generation prompt opens the thoughts (`<think>\\n`), or, with
`enable_thinking` false, closes an empty block. The API tests read reasoning output from it.
Usage: scripts/synth/think_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import gguf

FIXTURES = Path(__file__).resolve().parents[2] / "crates/shoal-model/tests/fixtures/synth"
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}\n</think>\n\n{% endif %}{% endif %}"
)


def main() -> None:
    src = gguf.GGUFReader(str(FIXTURES / "qwen3-s-f16.gguf"))
    out = FIXTURES / "qwen3-think-s-f16.gguf"
    arch = src.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    for name, field in src.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.chat_template"):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, value, vtype)
    w.add_chat_template(TEMPLATE)
    write_with_tensors(w, src, out)


def write_with_tensors(w: gguf.GGUFWriter, src: gguf.GGUFReader, out: Path) -> None:
    """Adds `src`'s tensors unchanged to `w` and writes the file `out`."""
    for t in src.tensors:
        w.add_tensor(t.name, t.data, raw_shape=list(reversed([int(d) for d in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out.name}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
