"""An Accelerate training script (run under torchrun, 2 processes) training a small GPT-2 (made
from a config) on fastload token loaders: gradient accumulation, gather_for_metrics over a
validation loader, save_state/load_state and skip_first_batches. Writes what it observed to
OUT/rankR.json. Usage: accelerate_lm.py DATA OUT."""

import hashlib
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

import fastload

data, out = sys.argv[1], Path(sys.argv[2])
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)  # cpu=True: multi-process on CPUs (CI has no GPU)
options = {"seq_len": 64, "packing": "best-fit", "block_tokens": 4096}
train = fastload.DataLoader(data, batch_size=4, seed=1, num_workers=1, attention="block-causal", **options)
val = fastload.DataLoader(data, batch_size=8, shuffle=False, **options)
vocab = train.dataset.index.tokenizer.vocab_size
model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=1, n_head=1, bos_token_id=0, eos_token_id=0))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
report: dict = {"prepared_is_fastload": isinstance(train, fastload.DataLoader), "syncs": [], "batches": len(train), "losses": []}


def digest(batch: dict) -> str:
    return hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]


for batch in train:
    with accelerator.accumulate(model):
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        accelerator.backward(loss)
        report["syncs"].append(accelerator.sync_gradients)
        report["losses"].append(loss.item())
        optimizer.step()
        optimizer.zero_grad()

rows = tokens = 0
for batch in val:
    per_row = accelerator.gather_for_metrics(batch["attention_mask"].sum(dim=1))  # with the last step's padding rows (split over the ranks)
    rows += int((per_row > 0).sum())
    tokens += int(per_row.sum())
report["val_rows"], report["val_tokens"] = rows, tokens

# epoch 1: save mid-epoch, finish, then load the saved state into the prepared loaders and compare
it = iter(train)
first = [digest(next(it)) for _ in range(2)]
accelerator.save_state(str(out / "state"))
accelerator.wait_for_everyone()  # only the main process writes the model and optimizer files
rest = [digest(b) for b in it]
accelerator.load_state(str(out / "state"))  # as a restarted run would, into the loaders prepare() listed
report["resumed_equal"] = [digest(b) for b in train] == rest
again = fastload.DataLoader(data, batch_size=4, seed=1, attention="block-causal", **options)
again.set_epoch(1)
report["skip_equal"] = [digest(b) for b in accelerator.skip_first_batches(again, 2)] == rest
report["epoch1"] = first + rest
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
