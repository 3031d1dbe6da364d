"""A Hugging Face ``Trainer`` fine-tune of a Llama-style causal LM, bf16, fused AdamW.

The family issue 27 measured (+1.6% allocated, +1.8% reserved simulated over the GPU
before gpumodel.accumulate): a ``LlamaForCausalLM`` built from a ``LlamaConfig`` here
(no hub download), trained by ``transformers.Trainer`` with ``bf16=True`` and
``optim="adamw_torch_fused"`` on made-up token ids (labels = inputs: the model shifts
them and computes its loss in float32 over the vocabulary). No saving, no logging
integrations. Prints the peaks at the end::

    python scripts/check/hf_trainer_finetune.py [--layers 8 --hidden 1024 ...]
    python -m gpu_mem_track run --simulate h200 scripts/check/hf_trainer_finetune.py

Needs ``transformers`` and ``accelerate``, and a CUDA device (or the simulated one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch


class TokenIds(torch.utils.data.Dataset):
    """``count`` random sequences of ``length`` token ids below ``vocab`` (labels: the ids)."""

    def __init__(self, count: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="decoder layers")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size")
    parser.add_argument("--intermediate", type=int, default=2816, help="MLP width")
    parser.add_argument("--heads", type=int, default=16, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=8, help="key/value heads")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary size")
    parser.add_argument("--length", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences per device step")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    args = parser.parse_args(argv)

    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(args.length, 2048),
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=1e-4,
            bf16=True,
            optim="adamw_torch_fused",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        data = TokenIds(args.batch * args.steps, args.length, args.vocab)
        Trainer(model=model, args=training, train_dataset=data).train()
    if torch.cuda.is_available():
        print(f"max_memory_allocated {torch.cuda.max_memory_allocated()}")
        print(f"max_memory_reserved {torch.cuda.max_memory_reserved()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
