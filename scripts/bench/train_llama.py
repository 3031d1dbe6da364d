"""A Hugging Face Trainer script with a Llama-style model in bfloat16, randomly
initialised from a config (no download): the script of issues 29 and 30 for ``fit``.

    python train_llama.py BATCH SEQ [--layers N] [--width W] [--gradient_accumulation_steps K]

BATCH (``sys.argv[1]``, ``fit --batch-arg 0``) is the per-device batch, SEQ the
sequence length. The weights are bfloat16 and the Trainer runs with ``bf16=True``, as
people fine-tune such a model; a few optimizer steps on random tokens.
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("batch", type=int)
parser.add_argument("seq", type=int)
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--width", type=int, default=2048)
parser.add_argument("--vocab", type=int, default=32000)
parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

config = LlamaConfig(
    hidden_size=args.width,
    intermediate_size=args.width * 11 // 4,
    num_hidden_layers=args.layers,
    num_attention_heads=max(1, args.width // 128),
    num_key_value_heads=max(1, args.width // 512),
    max_position_embeddings=args.seq,
    vocab_size=args.vocab,
    use_cache=False,
)
model = LlamaForCausalLM(config).to(torch.bfloat16)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = torch.randint(0, args.vocab, (args.seq,))
        return {"input_ids": ids, "labels": ids}


training = TrainingArguments(
    output_dir="trainer_out",
    per_device_train_batch_size=args.batch,
    gradient_accumulation_steps=args.gradient_accumulation_steps,
    max_steps=args.steps,
    bf16=True,
    logging_steps=1000,
    save_strategy="no",
    report_to=[],
    dataloader_num_workers=0,
)
Trainer(model=model, args=training, train_dataset=Tokens()).train()
