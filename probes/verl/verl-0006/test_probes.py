"""Probes for verl-0006 (FusedWorker: several worker roles in one Ray actor per rank).

The judge (this module) never imports verl, torch or ray: each probe starts Ray in a child
process, builds fused worker groups and sends back plain data (every role's values after a
sequence of calls, the process and Ray actor every role runs in, what siblings a role sees, the
results of the dispatch and execute modes), which the judge checks against what the calls it
chose imply.

The worker groups are CPU actors (use_gpu=False, one CPU per bundle), so the probes need no GPU.
At this verl version Worker.__init__ asks torch for the CUDA device name; a Ray worker-process
setup hook gives CPU-only worker processes a stand-in for that query (and does nothing where a
GPU is visible)."""

from infradev_probe import run, workdir

SETUP = """
import os
import ray

from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)


def _no_gpu_here():
    import torch

    if torch.cuda.device_count() == 0:
        torch.cuda.get_device_name = lambda *a, **k: "none"


ray.init(num_cpus=64, num_gpus=0, include_dashboard=False, object_store_memory=1 << 30,
         _temp_dir=os.path.join(ARGS["dir"], "ray"), runtime_env={"worker_process_setup_hook": _no_gpu_here})


class Role(Worker):
    NAME = "role"
    SIGN = 1

    def __init__(self, base, scale=1):
        super().__init__()
        self.base = base
        self.scale = scale
        self.value = 0
        self.log = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self, x):
        self.value += self.SIGN * x * self.scale
        self.log.append(x)
        return self.value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"role": self.NAME, "pid": os.getpid(), "actor_id": ray.get_runtime_context().get_actor_id(),
                "rank": self.rank, "world": self.world_size, "value": self.value, "base": self.base,
                "scale": self.scale, "log": list(self.log), "siblings": sorted(self.fused_worker_dict)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def poke(self, name, v):
        other = self.get_fused_worker_by_name(name)
        if other is None:
            return None
        other.value = v
        return other.NAME

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def head(self):
        return {"role": self.NAME, "rank": self.rank, "value": self.value}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data):
        data.batch["a"] += self.SIGN * (self.base + 100 * self.rank)
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def scaled(self, x):
        return self.SIGN * x * self.scale + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, x):
        self.value += self.SIGN * x
        return self.value


class Actor(Role):
    NAME = "actor"
    SIGN = 1


class Critic(Role):
    NAME = "critic"
    SIGN = -1


class Ref(Role):
    NAME = "ref"
    SIGN = 2


CLASSES = {"actor": Actor, "critic": Critic, "ref": Ref}


def class_dict(spec):
    # spec: {role: [base, scale]}; base is passed positionally, scale by keyword
    return {name: RayClassWithInitArgs(ray.remote(CLASSES[name]), b, scale=s) for name, (b, s) in spec.items()}


def pool(n):
    return RayResourcePool([n], use_gpu=False, max_colocate_count=1)


def known_actors():
    # every actor the cluster knows of, whatever its state
    from ray._private import state

    return sorted(state.actors())
"""


def test_each_role_keeps_its_own_state():
    spec = {"actor": [1, 2], "critic": [5, 3]}
    out = run(SETUP + """
try:
    wg = RayWorkerGroup(resource_pool=pool(2), ray_cls_with_init=create_colocated_worker_cls_fused(class_dict(ARGS["spec"])))
    roles = wg.spawn(prefix_set=["actor", "critic"])
    seq = []
    for name, x in ARGS["calls"]:
        seq.append([name, getattr(roles[name], "bump")(x)])
    again = wg.spawn(prefix_set=["critic", "actor"])
    seq.append(["critic", again["critic"].bump(7)])
    seq.append(["actor", again["actor"].bump(7)])
    emit(seq=seq, where={name: roles[name].where() for name in ("actor", "critic")})
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec, "calls": [["actor", 1], ["critic", 10], ["actor", 100], ["critic", 1000]]},
        timeout=600)
    sign = {"actor": 1, "critic": -1}
    value = {"actor": 0, "critic": 0}
    logs = {"actor": [], "critic": []}
    calls = [["actor", 1], ["critic", 10], ["actor", 100], ["critic", 1000], ["critic", 7], ["actor", 7]]
    for i, ((name, x), (got_name, got)) in enumerate(zip(calls, out["seq"])):
        value[name] += sign[name] * x * spec[name][1]
        logs[name].append(x)
        assert got == [value[name], value[name]], (
            f"call {i + 1}: {name}.bump({x}) returned {got} on the two ranks; want {value[name]} on each "
            f"({name} holds its own value, scale {spec[name][1]}, across calls and spawns)")
    for name in ("actor", "critic"):
        for r, w in enumerate(out["where"][name]):
            assert w["role"] == name and w["value"] == value[name] and w["log"] == logs[name], (
                f"rank {r}: the {name} role reports role {w['role']}, value {w['value']}, calls {w['log']}; "
                f"want role {name}, value {value[name]}, calls {logs[name]}")


def test_roles_of_a_rank_share_one_actor():
    spec = {"actor": [1, 1], "critic": [2, 1], "ref": [3, 1]}
    out = run(SETUP + """
try:
    Raw = create_colocated_worker_raw_cls(class_dict(ARGS["spec"]))

    class Hybrid(Raw):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def whoami(self):
            return {"pid": os.getpid(), "actor_id": ray.get_runtime_context().get_actor_id(),
                    "rank": self.rank, "world": self.world_size}

    cia = RayClassWithInitArgs(cls=ray.remote(Hybrid))
    cia.fused_worker_used = True
    wg = RayWorkerGroup(resource_pool=pool(3), ray_cls_with_init=cia)
    wg.fuse(["actor", "critic", "ref"])
    res = {"who": wg.whoami(), "world": wg.world_size}
    created = known_actors()
    roles = wg.spawn(prefix_set=["ref", "critic", "actor"])
    res["fused"] = {n: getattr(wg, n).where() for n in ("actor", "critic", "ref")}
    res["spawned"] = {n: roles[n].where() for n in ("actor", "critic", "ref")}
    res["role_world"] = {n: roles[n].world_size for n in ("actor", "critic", "ref")}
    res["extra_actors"] = sorted(set(known_actors()) - set(created))
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec}, timeout=600)
    who = out["who"]
    assert [w["rank"] for w in who] == [0, 1, 2] and all(w["world"] == 3 for w in who), (
        f"the fused workers report ranks/world sizes {[(w['rank'], w['world']) for w in who]}")
    assert len({w["pid"] for w in who}) == 3, f"the 3 ranks run in processes {[w['pid'] for w in who]}"
    assert out["extra_actors"] == [], (
        f"spawn() on a fused worker group (after fuse()) started {len(out['extra_actors'])} more Ray actors; "
        f"role groups must reuse the group's workers")
    for how in ("fused", "spawned"):
        for name in ("actor", "critic", "ref"):
            for r, w in enumerate(out[how][name]):
                assert w["pid"] == who[r]["pid"] and w["actor_id"] == who[r]["actor_id"], (
                    f"{how} group: the {name} role of rank {r} runs in process {w['pid']} (actor {w['actor_id']}); "
                    f"want the rank's fused worker, process {who[r]['pid']} (actor {who[r]['actor_id']})")
                assert w["rank"] == r and w["world"] == 3, (
                    f"{how} group: the {name} role of rank {r} has rank {w['rank']} of {w['world']}, want {r} of 3")
    assert out["world"] == 3 and out["role_world"] == {"actor": 3, "critic": 3, "ref": 3}, (
        f"world sizes: fused group {out['world']}, role groups {out['role_world']}")


def test_roles_see_their_siblings_and_own_init_args():
    spec = {"actor": [4, 2], "critic": [6, 5]}
    out = run(SETUP + """
try:
    Raw = create_colocated_worker_raw_cls(class_dict(ARGS["spec"]))

    class Hybrid(Raw):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def combo(self, x):
            return [self.actor.bump(x), self.critic.bump(x)]

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def lookup(self):
            return {"dict": sorted(self.fused_worker_dict),
                    "same": [self.fused_worker_dict[n] is getattr(self, n) for n in ("actor", "critic")],
                    "missing": self.get_fused_worker_by_name("nobody") is None}

    cia = RayClassWithInitArgs(cls=ray.remote(Hybrid))
    cia.fused_worker_used = True
    wg = RayWorkerGroup(resource_pool=pool(2), ray_cls_with_init=cia)
    wg.fuse(["actor", "critic"])
    res = {"lookup": wg.lookup(), "combo": wg.combo(3)}
    res["poke"] = wg.actor.poke("critic", 40)
    res["poke_missing"] = wg.critic.poke("nobody", 1)
    res["where"] = {n: getattr(wg, n).where() for n in ("actor", "critic")}
    res["back"] = wg.critic.poke("actor", -8)
    res["actor_after"] = wg.actor.where()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec}, timeout=600)
    for r, got in enumerate(out["lookup"]):
        assert got["dict"] == ["actor", "critic"] and got["same"] == [True, True] and got["missing"], (
            f"rank {r}: the fused worker's fused_worker_dict holds {got['dict']} (the role attributes are the same "
            f"objects: {got['same']}); get_fused_worker_by_name('nobody') is None: {got['missing']}")
    assert out["combo"] == [[3 * 2, -3 * 5]] * 2, f"the fused worker's own method combo(3) returned {out['combo']}"
    assert out["poke"] == ["critic", "critic"], (
        f"the actor role looked up its sibling 'critic' with get_fused_worker_by_name and got {out['poke']} "
        f"(None: no sibling); want the critic role on each rank")
    assert out["poke_missing"] == [None, None], f"get_fused_worker_by_name('nobody') from a role: {out['poke_missing']}"
    for name in ("actor", "critic"):
        base, scale = spec[name]
        for r, w in enumerate(out["where"][name]):
            assert w["siblings"] == ["actor", "critic"], (
                f"rank {r}: the {name} role's fused_worker_dict holds {w['siblings']}, want both roles")
            assert w["base"] == base and w["scale"] == scale, (
                f"rank {r}: the {name} role was built with base {w['base']}, scale {w['scale']}; want its own "
                f"init args {base} (positional) and scale={scale}")
    assert [w["value"] for w in out["where"]["critic"]] == [40, 40], (
        f"after the actor set its sibling critic's value to 40, the critic role reports "
        f"{[w['value'] for w in out['where']['critic']]}")
    assert out["back"] == ["actor", "actor"] and [w["value"] for w in out["actor_after"]] == [-8, -8], (
        f"the critic set the actor's value to -8 through its sibling: {out['back']}, actor now "
        f"{[w['value'] for w in out['actor_after']]}")


def test_role_methods_keep_their_dispatch_and_execute_modes():
    spec = {"actor": [1, 2], "critic": [10, 3]}
    out = run(SETUP + """
import torch

try:
    wg = RayWorkerGroup(resource_pool=pool(2), ray_cls_with_init=create_colocated_worker_cls_fused(class_dict(ARGS["spec"])))
    roles = wg.spawn(prefix_set=["actor", "critic"])
    res = {}

    def attempt(key, fn):
        try:
            res[key] = fn()
        except Exception as e:
            res[key] = {"error": "%s: %s" % (type(e).__name__, str(e)[:1500])}

    roles["actor"].bump(5)
    roles["critic"].bump(2)
    attempt("head_actor", lambda: roles["actor"].head())
    attempt("head_critic", lambda: roles["critic"].head())
    data = DataProto.from_dict({"a": torch.zeros(6)})
    attempt("shift_actor", lambda: roles["actor"].shift(data).batch["a"].tolist())
    attempt("shift_critic", lambda: roles["critic"].shift(data).batch["a"].tolist())
    attempt("scaled_actor", lambda: roles["actor"].scaled([10, 20]))
    attempt("scaled_critic", lambda: roles["critic"].scaled([10, 20]))

    def later():
        refs = roles["critic"].later(4)
        return {"kind": type(refs).__name__, "n": len(refs), "values": ray.get(list(refs))}

    attempt("later_critic", later)
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec}, timeout=600)
    for role, want in (("actor", {"role": "actor", "rank": 0, "value": 10}),
                       ("critic", {"role": "critic", "rank": 0, "value": -6})):
        got = out["head_" + role]
        assert got == want, (
            f"the {role} group's head() (Execute.RANK_ZERO) gave {got}; want one result, from rank 0 of the "
            f"{role} role: {want}")
    for role, sign, base in (("actor", 1, 1), ("critic", -1, 10)):
        want = [sign * (base + 100 * (i // 3)) for i in range(6)]
        got = out["shift_" + role]
        assert got == want, f"the {role} group's shift() (Dispatch.DP_COMPUTE_PROTO over 2 ranks): {got}, want {want}"
    assert out["scaled_actor"] == [10 * 2 + 0, 20 * 2 + 1], f"actor scaled (ALL_TO_ALL): {out['scaled_actor']}"
    assert out["scaled_critic"] == [-10 * 3 + 0, -20 * 3 + 1], f"critic scaled (ALL_TO_ALL): {out['scaled_critic']}"
    got = out["later_critic"]
    assert "error" not in got and got["n"] == 2 and got["values"] == [-10, -10], (
        f"critic later(4) (blocking=False): {got}; want 2 object refs resolving to -10 on each rank")
