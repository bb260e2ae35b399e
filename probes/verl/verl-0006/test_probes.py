"""Probes for verl-0006 (FusedWorker: several worker roles in one Ray actor per rank).

The judge (this module) never imports verl, torch or ray. Every probe draws its scenario fresh
(the world size, each role's init args, the sequence of calls and their arguments, which roles
are spawned, the values roles set on each other) and runs a driver in a child that builds fused
worker groups and sends back what the calls returned. The judge computes every expected value
from the scenario it chose: each role's running value, and a tally kept per process (so the
values only come out right when the roles of a rank share that rank's one actor process), the
siblings a role reaches, and what each dispatch and execute mode returns.

The worker groups are CPU actors (use_gpu=False, one CPU per bundle), so the probes need no GPU.
At this verl version Worker.__init__ asks torch for the CUDA device name; a Ray worker-process
setup hook gives CPU-only worker processes a stand-in for that query (and does nothing where a
GPU is visible)."""

from infradev_probe import fresh, run, workdir

SETUP = """
import os
import sys

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


# Ray starts no idle worker processes ahead of need: the sandbox caps the threads of the whole
# attempt, and every Ray worker process holds a few dozen.
os.environ["RAY_prestart_worker_first_driver"] = "0"
ray.init(num_cpus=64, num_gpus=0, include_dashboard=False, object_store_memory=1 << 30,
         _temp_dir=os.path.join(ARGS["dir"], "ray"), runtime_env={"worker_process_setup_hook": _no_gpu_here})


def _box():
    # one per process: roles that share an actor process share it
    return sys.__dict__.setdefault("_probe_tally", {"t": 0})


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
    def tally(self, x):
        box = _box()
        box["t"] = box["t"] * 3 + self.SIGN * x + self.rank
        return box["t"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"role": self.NAME, "rank": self.rank, "world": self.world_size, "value": self.value,
                "base": self.base, "scale": self.scale, "log": list(self.log),
                "siblings": sorted(self.fused_worker_dict)}

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
"""

SIGN = {"actor": 1, "critic": -1, "ref": 2}


def _spec(rng, roles):
    return {r: [int(rng.integers(-50, 50)), int(rng.integers(1, 9))] for r in roles}


def test_each_role_keeps_its_own_state():
    rng = fresh()
    world = int(rng.integers(2, 4))
    roles = ["actor", "critic"]
    spec = _spec(rng, roles)
    calls = [[str(rng.choice(roles)), int(rng.integers(-100, 100))] for _ in range(int(rng.integers(3, 8)))]
    again = [[r, int(rng.integers(-100, 100))] for r in rng.permutation(roles).tolist()]
    out = run(SETUP + """
try:
    wg = RayWorkerGroup(resource_pool=pool(ARGS["world"]),
                        ray_cls_with_init=create_colocated_worker_cls_fused(class_dict(ARGS["spec"])))
    roles = wg.spawn(prefix_set=["actor", "critic"])
    seq = []
    for name, x in ARGS["calls"]:
        seq.append(roles[name].bump(x))
    again = wg.spawn(prefix_set=[name for name, _ in ARGS["again"]])
    for name, x in ARGS["again"]:
        seq.append(again[name].bump(x))
    emit(seq=seq, where={name: roles[name].where() for name in ("actor", "critic")})
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec, "calls": calls, "again": again, "world": world}, timeout=300)
    value = {r: 0 for r in roles}
    logs = {r: [] for r in roles}
    assert len(out["seq"]) == len(calls) + len(again), f"{len(out['seq'])} results for {len(calls) + len(again)} calls"
    for i, ((name, x), got) in enumerate(zip(calls + again, out["seq"])):
        value[name] += SIGN[name] * x * spec[name][1]
        logs[name].append(x)
        assert got == [value[name]] * world, (
            f"call {i + 1}: {name}.bump({x}) returned {got} on the {world} ranks; want {value[name]} on each "
            f"({name} holds its own value, scale {spec[name][1]}, across calls and spawns)")
    for name in roles:
        assert len(out["where"][name]) == world, f"the {name} group answered from {len(out['where'][name])} ranks"
        for r, w in enumerate(out["where"][name]):
            assert w["role"] == name and w["value"] == value[name] and w["log"] == logs[name], (
                f"rank {r}: the {name} role reports role {w['role']}, value {w['value']}, calls {w['log']}; "
                f"want role {name}, value {value[name]}, calls {logs[name]}")


def test_roles_of_a_rank_share_one_actor():
    rng = fresh()
    world = int(rng.integers(2, 4))
    roles = ["actor", "critic", "ref"]
    spec = _spec(rng, roles)
    # calls of tally through the fused group's own method, its role attributes and spawned groups, in
    # random order: every call folds into one running tally per rank process
    steps = []
    for _ in range(int(rng.integers(4, 9))):
        steps.append([str(rng.choice(["own", "attr", "spawned"])), str(rng.choice(roles)), int(rng.integers(-9, 10))])
    order = rng.permutation(roles).tolist()
    out = run(SETUP + """
try:
    Raw = create_colocated_worker_raw_cls(class_dict(ARGS["spec"]))

    class Hybrid(Raw):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def own_tally(self, x):
            box = _box()
            box["t"] = box["t"] * 3 + 7 * x + self.rank
            return box["t"]

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def whoami(self):
            return {"rank": self.rank, "world": self.world_size}

    cia = RayClassWithInitArgs(cls=ray.remote(Hybrid))
    cia.fused_worker_used = True
    wg = RayWorkerGroup(resource_pool=pool(ARGS["world"]), ray_cls_with_init=cia)
    wg.fuse(["actor", "critic", "ref"])
    spawned = wg.spawn(prefix_set=ARGS["order"])
    res = {"who": wg.whoami(), "world": wg.world_size, "tallies": []}
    for how, role, x in ARGS["steps"]:
        if how == "own":
            res["tallies"].append(wg.own_tally(x))
        elif how == "attr":
            res["tallies"].append(getattr(wg, role).tally(x))
        else:
            res["tallies"].append(spawned[role].tally(x))
    res["fused"] = {n: getattr(wg, n).where() for n in ("actor", "critic", "ref")}
    res["spawned"] = {n: spawned[n].where() for n in ("actor", "critic", "ref")}
    res["role_world"] = {n: spawned[n].world_size for n in ("actor", "critic", "ref")}
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec, "world": world, "steps": steps, "order": order}, timeout=300)
    assert out["who"] == [{"rank": r, "world": world} for r in range(world)], (
        f"the fused workers report ranks/world sizes {out['who']}, want ranks 0-{world - 1} of {world}")
    tally = [0] * world
    for i, ((how, role, x), got) in enumerate(zip(steps, out["tallies"], strict=True)):
        for r in range(world):
            tally[r] = tally[r] * 3 + (7 * x if how == "own" else SIGN[role] * x) + r
        where = {"own": "the fused worker's own method", "attr": f"wg.{role}", "spawned": f"a spawned {role} group"}[how]
        assert got == tally, (
            f"step {i + 1} ({where}, x={x}): the per-process tallies are {got}, want {tally}: every role of rank r, "
            f"and the fused worker itself, must run in rank r's one fused actor process (spawning starts no actor)")
    for how in ("fused", "spawned"):
        for name in ("actor", "critic", "ref"):
            assert len(out[how][name]) == world, f"{how} {name} group answered from {len(out[how][name])} ranks"
            for r, w in enumerate(out[how][name]):
                assert w["rank"] == r and w["world"] == world and w["role"] == name, (
                    f"{how} group: the {name} role of rank {r} reports role {w['role']}, rank {w['rank']} of "
                    f"{w['world']}; want {name}, {r} of {world}")
                assert [w["base"], w["scale"]] == spec[name], (
                    f"{how} group: the {name} role of rank {r} was built with {[w['base'], w['scale']]}, want "
                    f"{spec[name]}")
    assert out["world"] == world and out["role_world"] == {n: world for n in roles}, (
        f"world sizes: fused group {out['world']}, role groups {out['role_world']}, want {world}")


def test_roles_see_their_siblings_and_own_init_args():
    rng = fresh()
    world = int(rng.integers(2, 4))
    roles = ["actor", "critic"]
    spec = _spec(rng, roles)
    x = int(rng.integers(1, 50))
    marks = {r: int(rng.integers(1000, 10 ** 6)) for r in roles}
    unknown = "role%x" % int(rng.integers(1 << 24))
    names = [str(n) for n in rng.permutation(roles + [unknown])]
    poke = {"from": str(rng.choice(roles))}
    poke["to"] = "critic" if poke["from"] == "actor" else "actor"
    poke["v"] = int(rng.integers(-10 ** 6, 10 ** 6))
    back = int(rng.integers(-10 ** 6, 10 ** 6))
    out = run(SETUP + """
try:
    Raw = create_colocated_worker_raw_cls(class_dict(ARGS["spec"]))

    class Hybrid(Raw):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def combo(self, x):
            return [self.actor.bump(x), self.critic.bump(x)]

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def lookup(self, marks, names):
            # mark every role through fused_worker_dict, read the marks back through the role attributes
            for n, v in marks.items():
                self.fused_worker_dict[n].value = v
            got = {"dict": sorted(self.fused_worker_dict), "attrs": [getattr(self, n).value for n in marks]}
            found = []
            for n in names:
                w = self.get_fused_worker_by_name(n)
                found.append(None if w is None else w.NAME)
            got["found"] = found
            for n in marks:
                self.fused_worker_dict[n].value = 0
            return got

    cia = RayClassWithInitArgs(cls=ray.remote(Hybrid))
    cia.fused_worker_used = True
    wg = RayWorkerGroup(resource_pool=pool(ARGS["world"]), ray_cls_with_init=cia)
    wg.fuse(["actor", "critic"])
    res = {"lookup": wg.lookup(ARGS["marks"], ARGS["names"]), "combo": wg.combo(ARGS["x"])}
    p = ARGS["poke"]
    res["poke"] = getattr(wg, p["from"]).poke(p["to"], p["v"])
    res["poke_missing"] = getattr(wg, p["to"]).poke(ARGS["unknown"], 1)
    res["where"] = {n: getattr(wg, n).where() for n in ("actor", "critic")}
    res["back"] = getattr(wg, p["to"]).poke(p["from"], ARGS["back"])
    res["from_after"] = getattr(wg, p["from"]).where()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec, "world": world, "x": x, "marks": marks, "names": names, "poke": poke,
      "unknown": unknown, "back": back}, timeout=300)
    want_lookup = {"dict": roles, "attrs": [marks[r] for r in marks], "found": [None if n == unknown else n for n in names]}
    assert out["lookup"] == [want_lookup] * world, (
        f"the fused worker's own method sees {out['lookup']}; want on every rank fused_worker_dict holding both roles "
        f"(the same objects as its role attributes: marks set through one read back through the other) and "
        f"get_fused_worker_by_name finding {want_lookup['found']} for {names}")
    want_combo = [x * spec["actor"][1], -x * spec["critic"][1]]
    assert out["combo"] == [want_combo] * world, (
        f"the fused worker's own method combo({x}) returned {out['combo']}, want {want_combo} on each rank")
    assert out["poke"] == [poke["to"]] * world, (
        f"the {poke['from']} role looked up its sibling {poke['to']!r} with get_fused_worker_by_name and got "
        f"{out['poke']} (None: no sibling); want the {poke['to']} role on each rank")
    assert out["poke_missing"] == [None] * world, f"get_fused_worker_by_name({unknown!r}) from a role: {out['poke_missing']}"
    for name in roles:
        base, scale = spec[name]
        for r, w in enumerate(out["where"][name]):
            assert w["siblings"] == roles, (
                f"rank {r}: the {name} role's fused_worker_dict holds {w['siblings']}, want both roles")
            assert w["base"] == base and w["scale"] == scale, (
                f"rank {r}: the {name} role was built with base {w['base']}, scale {w['scale']}; want its own "
                f"init args {base} (positional) and scale={scale}")
    assert [w["value"] for w in out["where"][poke["to"]]] == [poke["v"]] * world, (
        f"after the {poke['from']} set its sibling {poke['to']}'s value to {poke['v']}, the {poke['to']} role reports "
        f"{[w['value'] for w in out['where'][poke['to']]]}")
    assert out["back"] == [poke["from"]] * world and [w["value"] for w in out["from_after"]] == [back] * world, (
        f"the {poke['to']} set the {poke['from']}'s value to {back} through its sibling: {out['back']}, "
        f"{poke['from']} now {[w['value'] for w in out['from_after']]}")


def test_role_methods_keep_their_dispatch_and_execute_modes():
    rng = fresh()
    world = 2
    roles = ["actor", "critic"]
    spec = _spec(rng, roles)
    bumps = {r: int(rng.integers(-20, 20)) for r in roles}
    per = int(rng.integers(1, 4))
    a = rng.integers(-1000, 1000, size=world * per).tolist()
    scaled = {r: rng.integers(-100, 100, size=world).tolist() for r in roles}
    later = int(rng.integers(-50, 50))
    out = run(SETUP + """
import torch

try:
    wg = RayWorkerGroup(resource_pool=pool(ARGS["world"]),
                        ray_cls_with_init=create_colocated_worker_cls_fused(class_dict(ARGS["spec"])))
    roles = wg.spawn(prefix_set=["actor", "critic"])
    res = {}

    def attempt(key, fn):
        try:
            res[key] = fn()
        except Exception as e:
            res[key] = {"error": "%s: %s" % (type(e).__name__, str(e)[:1500])}

    for r in ("actor", "critic"):
        roles[r].bump(ARGS["bumps"][r])
    for r in ("actor", "critic"):
        attempt("head_" + r, lambda r=r: roles[r].head())
        data = DataProto.from_dict({"a": torch.tensor(ARGS["a"], dtype=torch.long)})
        attempt("shift_" + r, lambda r=r, data=data: roles[r].shift(data).batch["a"].tolist())
        attempt("scaled_" + r, lambda r=r: roles[r].scaled(ARGS["scaled"][r]))

    def later():
        refs = roles["critic"].later(ARGS["later"])
        return {"kind": type(refs).__name__, "n": len(refs), "values": ray.get(list(refs))}

    attempt("later_critic", later)
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "spec": spec, "world": world, "bumps": bumps, "a": a, "scaled": scaled,
      "later": later}, timeout=300)
    value = {r: SIGN[r] * bumps[r] * spec[r][1] for r in roles}
    for role in roles:
        want = {"role": role, "rank": 0, "value": value[role]}
        got = out["head_" + role]
        assert got == want, (
            f"the {role} group's head() (Execute.RANK_ZERO) after bump({bumps[role]}) gave {got}; want one result, "
            f"from rank 0 of the {role} role: {want}")
        want = [v + SIGN[role] * (spec[role][0] + 100 * (i // per)) for i, v in enumerate(a)]
        got = out["shift_" + role]
        assert got == want, (
            f"the {role} group's shift() (Dispatch.DP_COMPUTE_PROTO over {world} ranks): {got}, want {want}")
        want = [SIGN[role] * v * spec[role][1] + r for r, v in enumerate(scaled[role])]
        assert out["scaled_" + role] == want, (
            f"{role} scaled({scaled[role]}) (ALL_TO_ALL): {out['scaled_' + role]}, want {want}")
    got = out["later_critic"]
    want = value["critic"] - later
    assert "error" not in got and got["n"] == world and got["values"] == [want] * world, (
        f"critic later({later}) (blocking=False): {got}; want {world} object refs resolving to {want} on each rank")
