"""The data handling of pytorch/examples' imagenet main.py under torchrun (gloo, 2 processes),
with only the dataset and DataLoader constructions changed to fastload: DistributedSampler for
train and val (drop_last=True for val), set_epoch each epoch, and a remainder loader over a Subset
of val_loader.dataset. Usage: torchrun_imagenet_style.py DATA OUT"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import Subset
from torch.utils.data.distributed import DistributedSampler

import fastload

data, out = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
world, rank = dist.get_world_size(), dist.get_rank()
train_dataset = fastload.open(data)  # was: datasets.ImageFolder(traindir, transforms.Compose([...]))
val_dataset = fastload.open(data)
train_sampler = DistributedSampler(train_dataset)
val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
train_loader = fastload.DataLoader(train_dataset, batch_size=4, shuffle=(train_sampler is None), num_workers=2,
                                   pin_memory=True, sampler=train_sampler, transform=fastload.transforms.train(8), return_keys=True)
val_loader = fastload.DataLoader(val_dataset, batch_size=4, shuffle=False, num_workers=2, pin_memory=True,
                                 sampler=val_sampler, transform=fastload.transforms.val(8), return_keys=True)
epochs = []
for epoch in range(2):
    train_sampler.set_epoch(epoch)
    epochs.append([k for _, _, keys in train_loader for k in keys])
validated = [k for _, _, keys in val_loader for k in keys]
remainder = []
if len(val_loader.sampler) * world < len(val_loader.dataset):
    aux_val_dataset = Subset(val_loader.dataset, range(len(val_loader.sampler) * world, len(val_loader.dataset)))
    aux_val_loader = fastload.DataLoader(aux_val_dataset, batch_size=4, shuffle=False, num_workers=2, pin_memory=True,
                                         transform=fastload.transforms.val(8), return_keys=True)
    remainder = [k for _, _, keys in aux_val_loader for k in keys]
# --resume: a fresh loader whose sampler is set to epoch 1 replays epoch 1, not epoch 0
resumed_sampler = DistributedSampler(train_dataset)
resumed = fastload.DataLoader(train_dataset, batch_size=4, sampler=resumed_sampler, transform=fastload.transforms.train(8), return_keys=True)
resumed_sampler.set_epoch(1)
report = {"epochs": epochs, "validated": validated, "remainder": remainder, "resumed_epoch1": [k for _, _, keys in resumed for k in keys],
          "sampler_len": len(val_loader.sampler), "local_rank": int(os.environ["LOCAL_RANK"])}
(out / f"rank{rank}.json").write_text(json.dumps(report))
dist.destroy_process_group()
