"""The gloo process group of a test worker started by torchrun.

torch 2.13's torchrun (--standalone, the agent's store) keeps the workers' keys from one attempt
to the next: after a restart, a rank could read the address the killed attempt's rank had
published and fail with "Gloo connectFullMesh failed ... Connection refused" (3 of 3 restarts in
test_torch_ckpt_train, 1 in 3 in test_torch_state). Each attempt's group therefore keeps its keys
under a prefix of its own (TORCHELASTIC_RESTART_COUNT). Outside torchrun: the default init."""
import os

import torch.distributed as dist


def init_gloo(timeout):
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        dist.init_process_group("gloo", timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size=world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("attempt-%s" % attempt, store),
                            rank=rank, world_size=world, timeout=timeout)
