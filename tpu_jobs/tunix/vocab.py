"""The toy task's token ids as a tokenizer Tunix accepts (encode, decode, bos/eos/pad ids).

Tunix's rollout works on text: a prompt is rendered as space-separated token names
(``"<bos> 3 1 4 1 <sep>"``) and a completion decodes back to names. The ids are the toy task's
own (digits 0..9, BOS 10, SEP 11, `tpu_jobs.task`), so a Tunix checkpoint scores on the same
prompts as the toy trainer's; EOS and PAD take two of the task's unused ids. A completion that
starts with EOS or PAD comes back empty from Tunix's sampler (no gradient, reward 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpu_jobs import task

EOS = 12
PAD = 13
NAMES: tuple[str, ...] = (
    *(str(d) for d in range(10)),
    "<bos>",
    "<sep>",
    "<eos>",
    "<pad>",
    "<unused14>",
    "<unused15>",
)
assert len(NAMES) == task.VOCAB_SIZE and NAMES[task.BOS] == "<bos>" and NAMES[task.SEP] == "<sep>"
_IDS = {name: i for i, name in enumerate(NAMES)}


class DigitTokenizer:
    """Whitespace-separated token names <-> ids; an unknown name is an error, not a guess."""

    def encode(self, text: str, **_: object) -> list[int]:
        try:
            return [_IDS[name] for name in text.split()]
        except KeyError as e:
            raise ValueError(f"not a token of the digit vocabulary: {e.args[0]!r}") from None

    def decode(self, ids: Sequence[int], **_: object) -> str:
        return " ".join(NAMES[int(i)] for i in ids)

    def bos_id(self) -> int:
        return task.BOS

    def eos_id(self) -> int:
        return EOS

    def pad_id(self) -> int:
        return PAD


def prompt_text(prompt: Sequence[int]) -> str:
    """One task prompt (``[BOS, d0..d3, SEP]``) as the text Tunix's rollout tokenizes back."""
    return " ".join(NAMES[int(t)] for t in prompt)


def answer_text(answer: Sequence[int]) -> str:
    return " ".join(NAMES[int(t)] for t in answer)


def batch(seed: int, step: int, num_prompts: int) -> dict[str, np.ndarray]:
    """Step `step`'s training batch as Tunix wants it: numpy arrays of strings (a Python list
    would be tree-mapped element-wise by the learner); ``answer`` reaches the reward function."""
    prompts = task.train_prompts(seed, step, num_prompts)
    answers = task.answers(prompts)
    return {
        "prompts": np.asarray([prompt_text(p) for p in prompts]),
        "answer": np.asarray([answer_text(a) for a in answers]),
    }


def exact_match_reward(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: object
) -> list[float]:
    """The task's reward on text: 1.0 when the completion is exactly the answer's tokens."""
    del prompts
    return [
        1.0 if c.split() == a.split() else 0.0 for c, a in zip(completions, answer, strict=True)
    ]
