"""Run in a subprocess by test_sharding.py: FSDP2 on a fake process group, measured by PyTorch's FSDPMemTracker
(torch.distributed._tools.fsdp2_mem_tracker), as torchtitan's scripts/estimate/estimation.py does.

    python tests/fsdp_trace_helper.py WORLD_SIZE GRAD_CKPT   -> prints {"tracker": bytes, "estimate": bytes}
"""

import json
import sys
import warnings

import torch
import torch.distributed as dist
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from memfit import TrainingSetup, estimate
from memfit.physics.overhead import CUBLAS_WORKSPACE_BYTES
from memfit.spec import ModelSpec
from memfit.trace.step import cuda_like_kernels

CONFIG = dict(model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=False)


def main(world: int, ckpt: bool) -> None:
    warnings.simplefilter("ignore")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    mesh = init_device_mesh("cpu", (world,))      # outside fake mode: the mesh holds real tensors
    setup = TrainingSetup(method="full", precision="bf16", optimizer="adamw", batch_size=2, seq_len=256,
                          gpus=world, shard="fsdp", grad_ckpt=ckpt)
    config = transformers.AutoConfig.for_model(**CONFIG, use_cache=False)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, CONFIG["vocab_size"], (setup.batch_size, setup.seq_len))
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
        with cuda_like_kernels(setup, None), tracker:
            for step in range(2):
                model(input_ids=ids, labels=ids).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step == 0:
                    tracker.reset_mod_stats()
        measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    spec = ModelSpec.from_hf_config(CONFIG, name="fsdp-test", source="test")
    predicted = estimate(spec, setup).peak_allocated_bytes - CUBLAS_WORKSPACE_BYTES   # no cuBLAS on a CPU
    detail = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    print(json.dumps({"tracker": measured, "estimate": predicted, "detail": {str(k): v for k, v in detail.items()}}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1")
