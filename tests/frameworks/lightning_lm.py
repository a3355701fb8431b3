"""Lightning DDP on 2 CPU processes training a small GPT-2 (made from a config) on a fastload token
loader built at top level, before any process group exists. Each rank writes a digest of every
batch it trained on and the loss; a checkpoint is saved every 3 steps (mid-epoch), as a run that
expects to be preempted would. Usage: lightning_lm.py DATA OUT [CKPT_TO_RESUME]."""

import hashlib
import json
import sys
from pathlib import Path

import lightning as L
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import fastload

data, out = sys.argv[1], Path(sys.argv[2])
resume = sys.argv[3] if len(sys.argv) > 3 else None
loader = fastload.DataLoader(data, batch_size=4, seq_len=64, packing="best-fit", seed=3, num_workers=1, block_tokens=4096)


class LanguageModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        vocab = loader.dataset.index.tokenizer.vocab_size
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=1, n_head=1, bos_token_id=0, eos_token_id=0))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        logits = self.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        digest = hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]
        with open(out / f"rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "batch": digest, "loss": loss.item()}) + "\n")
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=out, filename="{step}", every_n_train_steps=3, save_top_k=-1)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    callbacks=[checkpoints], enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LanguageModel(), loader, ckpt_path=resume)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()  # else gloo's threads can abort the exit ("terminate called ...")
