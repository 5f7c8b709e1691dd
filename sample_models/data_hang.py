"""A loader that hangs at the start of an epoch: __getitem__ waits on an event nobody sets (bounded to
STUCK_S seconds so a test's process can finish), in this process or in DataLoader workers."""
import threading

from torch.utils.data import DataLoader, Dataset

from data_fake import FakeData

STUCK_S = 6.0


class Stuck(Dataset):
    def __init__(self):
        self.base = FakeData(64)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        wait_for_a_lock_nobody_releases()
        return self.base[i]


def wait_for_a_lock_nobody_releases():
    threading.Event().wait(STUCK_S)


def in_process():
    return DataLoader(Stuck(), batch_size=8)


def in_workers():
    return DataLoader(Stuck(), batch_size=8, num_workers=2)
