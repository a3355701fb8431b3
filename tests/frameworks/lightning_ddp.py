"""Lightning DDP on 2 CPU processes with a fastload loader built at top level, before any process
group exists (the most common Lightning call). Each rank writes the keys of every batch it
trained on; a checkpoint is saved every 3 steps (mid-epoch: 6 batches an epoch), as a run that
expects to be preempted would. Usage: lightning_ddp.py DATA OUT [CKPT_TO_RESUME] [--mix]
(--mix: the loader reads DATA as a one-member fastload.mix, its order and state the mixture's)."""

import json
import sys
from pathlib import Path

import lightning as L
import torch

import fastload

arguments = [a for a in sys.argv[1:] if a != "--mix"]
data, out = arguments[0], Path(arguments[1])
resume = arguments[2] if len(arguments) > 2 else None
source = fastload.mix({data: 1}) if "--mix" in sys.argv else data
loader = fastload.DataLoader(source, batch_size=4, shuffle=True, seed=3, transform=fastload.transforms.val(8), return_keys=True)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 4)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        images, labels, keys = batch
        with open(out / f"rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "keys": keys}) + "\n")
        return torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1)), labels % 4)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=out, filename="{step}", every_n_train_steps=3, save_top_k=-1)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, callbacks=[checkpoints],
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), loader, ckpt_path=resume)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()  # else gloo's threads can abort the exit ("terminate called ...")
