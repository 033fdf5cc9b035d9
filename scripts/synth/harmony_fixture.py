#!/usr/bin/env python3
"""Writes qwen3-harmony-s-f16.gguf next to the synthetic fixtures: the weights and model metadata of
qwen3-s-f16.gguf (512 tokens) with the tokenizer of gpt-oss-k-mxfp4_moe.gguf (o200k_harmony's shape: the
gpt-4o pre-tokenizer, harmony's special tokens <|start|> <|channel|> <|message|> <|constrain|> <|end|>
<|return|> <|call|>, 512 tokens too) and a chat template written for shoal in the harmony format gpt-oss's
template uses: a system message with `Reasoning: <reasoning_effort>` and the valid channels, a developer
message with the instructions and the tools as a `functions` namespace, earlier tool calls (after their
thoughts, the message's `thinking`, as an analysis message) as
`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>` and their results
as `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>"RESULT"<|end|>`, answers on the
final channel; the generation prompt is `<|start|>assistant`.

Random weights never write a channel header of their own, so one thing differs from gpt-oss's template:
with `reasoning_effort` "high" the generation prompt opens an analysis message
(`<|start|>assistant<|channel|>analysis<|message|>`), as a continued answer's does, and what the model
writes is its thoughts. The API tests read reasoning that way, forced tool calls through the grammar that
writes harmony's call header, and the prompt's `Reasoning:` line from the template.
Usage: scripts/synth/harmony_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import gguf
from think_fixture import write_with_tensors

FIXTURES = Path(__file__).resolve().parents[2] / "crates/shoal-model/tests/fixtures/synth"
TEMPLATE = """<|start|>system<|message|>You are a synthetic test model.
Reasoning: {{ reasoning_effort | default('medium') }}

# Valid channels: analysis, commentary, final.
{%- if tools %} Calls to these tools must go to the commentary channel: 'functions'.{% endif %}<|end|>
{%- set head = messages[0].role in ['system', 'developer'] %}
{%- if head %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}
{%- if head or tools %}<|start|>developer<|message|>
{%- if head %}# Instructions

{{ messages[0].content }}
{% endif %}
{%- if tools %}
# Tools

namespace functions {
{%- for t in tools %}

// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{%- endfor %}

} // namespace functions
{%- endif %}<|end|>
{%- endif %}
{%- set last = namespace(name='') %}
{%- for m in rest %}
{%- if m.role == 'assistant' and m.tool_calls %}
{%- set call = m.tool_calls[0].function if m.tool_calls[0].function is defined else m.tool_calls[0] %}
{%- if m.thinking is defined %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>
{%- elif m.content %}<|start|>assistant<|channel|>analysis<|message|>{{ m.content }}<|end|>{% endif %}
<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>{{ call.arguments | tojson }}<|call|>
{%- set last.name = call.name %}
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.{{ last.name }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant
{%- if reasoning_effort is defined and reasoning_effort == 'high' %}<|channel|>analysis<|message|>{% endif %}
{%- endif %}"""


def main() -> None:
    weights = gguf.GGUFReader(str(FIXTURES / "qwen3-s-f16.gguf"))
    vocab = gguf.GGUFReader(str(FIXTURES / "gpt-oss-k-mxfp4_moe.gguf"))
    out = FIXTURES / "qwen3-harmony-s-f16.gguf"
    arch = weights.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(out), arch)

    def copy(reader: gguf.GGUFReader, keep) -> None:
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or not keep(name):
                continue
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
            else:
                w.add_key_value(name, field.contents(), vtype)

    copy(weights, lambda n: n != "general.architecture" and not n.startswith("tokenizer."))
    copy(vocab, lambda n: n.startswith("tokenizer.") and n != "tokenizer.chat_template")
    w.add_chat_template(TEMPLATE)
    write_with_tensors(w, weights, out)


if __name__ == "__main__":
    main()
