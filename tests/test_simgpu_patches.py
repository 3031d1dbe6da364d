"""simgpu.patches: a function set in several places is a distinct object in each, and
restoring empties TorchDynamo's table of torch objects (built with the stand-ins, it
refused one object under two names: "Duplicate torch object ... with different rules")."""

from __future__ import annotations

import sys
import types

from gpu_mem_track.simgpu.patches import Patches


def _stand_in(*args, **kwargs):
    return None


def test_one_function_set_twice_is_two_objects_that_behave_alike_and_both_are_put_back():
    owner = types.SimpleNamespace(a=1, b=2)
    patches = Patches()
    patches.set(owner, "a", _stand_in)
    patches.set(owner, "b", _stand_in)
    assert owner.a is _stand_in and owner.b is not owner.a
    assert owner.b.__code__ is _stand_in.__code__ and owner.b.__qualname__ == _stand_in.__qualname__
    assert owner.b(1, x=2) is None
    patches.restore()
    assert (owner.a, owner.b) == (1, 2)
    # After a restore the same function may be set once again as itself.
    patches.set(owner, "a", _stand_in)
    assert owner.a is _stand_in
    patches.restore()


def test_restore_empties_dynamos_table_of_torch_objects():
    import torch._dynamo.trace_rules as rules

    rules.get_torch_obj_rule_map()
    assert rules.get_torch_obj_rule_map.cache_info().currsize == 1
    Patches().restore()
    assert "torch._dynamo.trace_rules" in sys.modules
    assert rules.get_torch_obj_rule_map.cache_info().currsize == 0


def test_the_classes_fully_shard_cached_during_a_session_are_forgotten_after_it():
    import torch.distributed.fsdp._fully_shard._fully_shard as fsdp

    from gpu_mem_track import simulated_gpu

    class Earlier:
        pass

    class Model:
        pass

    fsdp.cls_to_fsdp_cls[Earlier] = object
    try:
        with simulated_gpu("a100-40gb"):
            fsdp.cls_to_fsdp_cls[Model] = object  # what fully_shard(Model()) caches
        assert Model not in fsdp.cls_to_fsdp_cls  # it held the script's namespace alive
        assert fsdp.cls_to_fsdp_cls[Earlier] is object  # what was there before stays
    finally:
        fsdp.cls_to_fsdp_cls.pop(Earlier, None)
