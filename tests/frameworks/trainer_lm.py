"""Hugging Face's Trainer training a small GPT-2 (made from a config) on a fastload token loader,
through a ``get_train_dataloader`` override (as README shows), in the loader's ``transformers``
format: labels lined up with the inputs (the model shifts them) and ``attention="block-causal"``'s
4-D mask, which keeps each row's documents apart. Writes every step's batch digest
and the logged losses to OUT/steps.jsonl. Usage: trainer_lm.py DATA OUT STEPS [CHECKPOINT_TO_RESUME]."""

import hashlib
import json
import sys
from pathlib import Path

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import fastload

data, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
resume = sys.argv[4] if len(sys.argv) > 4 else None


class FastloadTrainer(Trainer):
    def get_train_dataloader(self):  # type: ignore[no-untyped-def]
        loader = fastload.DataLoader(data, batch_size=self.args.per_device_train_batch_size, seq_len=64, packing="best-fit",
                                     batch_format="transformers", attention="block-causal", seed=self.args.seed, block_tokens=4096,
                                     device=self.args.device)
        return self.accelerator.prepare(loader)

    def compute_loss(self, model, inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert set(inputs) == {"input_ids", "labels", "position_ids", "attention_mask"} and inputs["attention_mask"].dim() == 4
        with open(out / "steps.jsonl", "a") as f:
            f.write(json.dumps({"step": self.state.global_step, "batch": hashlib.sha256(inputs["input_ids"].numpy().tobytes()).hexdigest()[:16]}) + "\n")
        return super().compute_loss(model, inputs, *args, **kwargs)


tokenizer = fastload.open(data).index.tokenizer
model = GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=1, n_head=1,
                                   bos_token_id=tokenizer.eos_id, eos_token_id=tokenizer.eos_id))
args = TrainingArguments(output_dir=str(out / "run"), max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
                         logging_steps=5, save_strategy="steps", save_steps=10, report_to=[], use_cpu=True, seed=7,
                         disable_tqdm=True)
trainer = FastloadTrainer(model=model, args=args, train_dataset=[0])  # the dataset is the override's: a placeholder
trainer.train(resume_from_checkpoint=resume)
losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
(out / "losses.json").write_text(json.dumps(losses))
