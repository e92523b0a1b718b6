"""The vector ISA tblock.peers reports for torch in this process's environment
(tests/test_peers.py): python torch_isa.py."""

import tblock
from tblock import peers

cfg = tblock.BlockConfig(d_model=16, n_heads=2)
print(peers.build("torch", tblock.init_weights(cfg, seed=0), cfg).isa[0])
