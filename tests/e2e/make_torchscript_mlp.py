"""Writes a small MLP classifier scripted with torch.jit.script (for e2e_torchscript.sh)."""
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


torch.jit.script(Net()).save(sys.argv[1])
