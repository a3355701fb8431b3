"""An Accelerate training script (run under torchrun, 2 processes) with fastload loaders: gradient
accumulation, gather_for_metrics over a validation loader, save_state/load_state and
skip_first_batches. Writes what it observed to OUT/rankR.json. Usage: accelerate_train.py DATA OUT [--mix]
(--mix: every loader reads DATA as a one-member fastload.mix, its order and state the mixture's)."""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

import fastload

data, out = sys.argv[1], Path(sys.argv[2])
if "--mix" in sys.argv[3:]:
    data = fastload.mix({data: 1})
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)  # cpu=True: multi-process on CPUs (CI has no GPU)
train = fastload.DataLoader(data, batch_size=4, shuffle=True, seed=1, transform=fastload.transforms.val(8), return_keys=True)
val = fastload.DataLoader(data, batch_size=8, transform=fastload.transforms.val(8))
model = torch.nn.Linear(3 * 8 * 8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
report: dict = {"prepared_is_fastload": isinstance(train, fastload.DataLoader), "syncs": [], "batches": len(train)}

for _step, (images, labels, _keys) in enumerate(train):
    with accelerator.accumulate(model):
        loss = torch.nn.functional.cross_entropy(model(images.float().flatten(1)), labels % 4)
        accelerator.backward(loss)
        report["syncs"].append(accelerator.sync_gradients)
        optimizer.step()
        optimizer.zero_grad()

seen = 0
for _, labels in val:
    seen += len(accelerator.gather_for_metrics(labels))
report["val_seen"] = seen

# epoch 1: save mid-epoch, finish, then load the saved state into fresh loaders and compare
it = iter(train)
first = [k for _, _, keys in (next(it), next(it)) for k in keys]
accelerator.save_state(str(out / "state"))
accelerator.wait_for_everyone()  # only the main process writes the model and optimizer files
rest = [k for _, _, keys in it for k in keys]
accelerator.load_state(str(out / "state"))  # as a restarted run would, into the loaders prepare() listed
report["resumed_equal"] = [k for _, _, keys in train for k in keys] == rest
train3 = fastload.DataLoader(data, batch_size=4, shuffle=True, seed=1, transform=fastload.transforms.val(8), return_keys=True)
train3.set_epoch(1)
skipped = accelerator.skip_first_batches(train3, 2)
report["skip_equal"] = [k for _, _, keys in skipped for k in keys] == rest
report["epoch1_keys"] = first + rest
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
