"""The devices a job runs on: flow.config's device count, flow.env's
processes, the job's placement and logical view, turned into the
`distribution` the compiler takes (see jit/distribute.h), and the device
(CPU, one GPU, or several GPUs joined by NCCL, of this process or of every
process of the session) it is compiled for."""
import warnings
import weakref

from .. import _C


def process_info():
    """(rank of this process, number of processes)."""
    from .. import env
    return env._process_rank(), env._process_count()


def local_device_count():
    from .. import config
    return config._settings["cpu_device_num"]


def ensure_configured():
    """Sets up this process's devices and their communicator once the
    settings are known (the first call of a job function)."""
    from .. import env
    local = local_device_count()
    rank, procs = process_info()
    info = _C.device_info()
    if procs > 1:
        env._configure_processes(local)
    elif info["local_devices"] != local or info["several_processes"] or not info["ranks"]:
        _C.configure_devices(local)


_splits = {"generation": None, "axes": {}}


def _session_splits(job, builder):
    """Declared splits are the variable's, not the job's: a job that uses a
    variable without distribute= (an eval job) lays it out as the job that
    declared it did. Two different declarations are an error."""
    gen = _C.session_generation()
    if _splits["generation"] != gen:
        _splits.update(generation=gen, axes={})
    axes = _splits["axes"]
    for name, axis in builder.split_vars.items():
        if axes.get(name, axis) != axis:
            raise ValueError(f"job '{job}': variable '{name}' is declared split({axis}) but another job "
                             f"declared it split({axes[name]}); a variable has one layout per session")
    axes.update(builder.split_vars)
    return {name: axes[name] for name in builder.variables if name in axes}


def list_arrays(job, config):
    """How many arrays a list placeholder (the mirrored view) takes: one per
    GPU of this process for a job placed on several GPUs (by function_config's
    default placement or a scope around the call), else one per CPU device."""
    placement = _outer_placement(config)
    if placement is not None and placement.device_tag == "gpu":
        ordinals, total = _gpu_placement(job, placement)
        if total > 1:
            return len(ordinals)
    return local_device_count()


def _placement_devices(job, placement):
    if placement.device_tag == "gpu":
        return _gpu_placement(job, placement)[1]  # or a clear error
    return sum(len(devs) for _, devs in placement.devices)


def gpu_first_rank(placement):
    """The NCCL rank of this process's first GPU of a job placed on "gpu":
    the GPUs of the machines (processes) before it come first."""
    rank, _ = process_info()
    return sum(len(devs) for machine, devs in placement.devices if machine < rank)


def _gpu_ordinals(job, placement):
    """This process's GPUs of a job placed on "gpu"."""
    return _gpu_placement(job, placement)[0]


def _gpu_placement(job, placement):
    """(this process's GPUs, the number of the job's GPUs in all processes)
    for a job placed on "gpu": one GPU, several of this process, or in a
    session over several processes (flow.env) the GPUs of machine <rank> in
    each, the same number per process; collectives between GPUs go through
    NCCL. Errors name what is not supported."""
    from .. import config
    devices = [(m, d) for m, devs in placement.devices for d in devs]
    rank, procs = process_info()
    for machine, _ in devices:
        if machine >= procs:
            if procs == 1:
                raise ValueError(f"job '{job}' is placed on machine {machine} ({placement!r}), but this "
                                 "session runs on one machine, 0; use flow.scope.placement(\"gpu\", \"0:<gpu>\")")
            raise ValueError(f"job '{job}' is placed on machine {machine} ({placement!r}), but the session "
                             f"has {procs} processes (machines 0 to {procs - 1})")
    per_machine = [[d for m, d in devices if m == p] for p in range(procs)]
    if procs > 1 and not per_machine[rank]:
        raise NotImplementedError(
            f"job '{job}' is placed on GPUs {placement!r}, none of them on machine {rank} (this "
            "process); a job over several processes needs GPUs in each, e.g. [\"0:0\", \"1:0\"]")
    ordinals = per_machine[rank]
    if len(set(ordinals)) != len(ordinals):
        raise ValueError(f"job '{job}' is placed on GPUs {ordinals} ({placement!r}): each GPU once")
    configured = config._settings["gpu_device_num"]
    for ordinal in ordinals:
        if configured and ordinal >= configured:
            raise ValueError(f"job '{job}' is placed on GPU {ordinal} ({placement!r}), but "
                             f"flow.config.gpu_device_num({configured}) configures GPU"
                             f"{' 0' if configured == 1 else f's 0 to {configured - 1}'}")
    return ordinals, len(devices)


# Per function config, the jobs already warned that they fell back to the CPU.
_fallback_warned = weakref.WeakKeyDictionary()


def job_target(job, config, builder, params):
    """The device settings of _C.compile_job: {} for the CPU, {"device": "gpu",
    "gpu": ordinal} for a job placed on a GPU that can run there. A GPU that
    cannot be used (no driver, no such GPU) raises RuntimeError saying why,
    or, with function_config.allow_cpu_fallback(True), warns once and runs
    the job on the CPU."""
    from .. import config as _config
    placement = _job_placement(job, config, builder)
    if placement is None or placement.device_tag != "gpu":
        return {}
    ordinals, total = _gpu_placement(job, placement)
    ordinal = ordinals[0]
    _, procs = process_info()
    lists = [name for name, ph in params if ph.kind != "Numpy"]
    if lists and total > 1 and list_arrays(job, config) != len(ordinals):
        raise NotImplementedError(
            f"job '{job}' is placed on {total} GPUs by a scope in its body, but parameter "
            f"'{lists[0]}' is a list placeholder (the mirrored view), whose arrays (one per GPU) "
            "are counted before the body runs; place the job with "
            "function_config().default_placement_scope(...) or a scope around the call")
    if lists and _config.device_count() != 1:
        raise NotImplementedError(
            f"job '{job}' is placed on one GPU, but parameter '{lists[0]}' is a list placeholder, which "
            f"takes one array per device: flow.config.cpu_device_num({_config.device_count()}) asks for "
            f"{_config.device_count()}; use flow.config.cpu_device_num(1) with jobs on a GPU")
    unusable = [(o, _C.gpu_status(o)) for o in ordinals]
    unusable = [(o, st) for o, st in unusable if not st["available"]]
    if not unusable:
        target = {"device": "gpu", "gpu": ordinal}
        if total > 1:
            target["gpus"] = ordinals
            target["gpu_processes"] = procs
            target["gpu_first_rank"] = gpu_first_rank(placement)
            target["gpu_world"] = total
        return target
    ordinal, status = unusable[0]
    reason = status["reason"]
    if not config.get("allow_cpu_fallback", False):
        raise RuntimeError(
            f"job '{job}' is placed on GPU {ordinal} ({placement!r}) but cannot run there: {reason}. "
            "Run it where an NVIDIA GPU and driver are, place it on \"cpu\", or let it fall back "
            "with function_config.allow_cpu_fallback(True)")
    warned = _fallback_warned.setdefault(config, set())
    if job not in warned:
        warned.add(job)
        warnings.warn(f"job '{job}' is placed on GPU {ordinal} but runs on the CPU: {reason} "
                      "(function_config.allow_cpu_fallback(True))", RuntimeWarning,
                      stacklevel=6)  # job_target < _compile_traced < _compile < _call_slow < __call__ < the call
    return {}


def _outer_placement(config):
    """A scope around the call, else function_config's default placement."""
    from .. import scope
    around = scope.current_placement()
    return around if around is not None else config.get("default_placement_scope")


def job_stages(job, config, builder):
    """The placements of a job whose ops are placed on different device sets
    (scopes in the body that differ from each other or from the job's own
    placement), as (placements, index of the job's own placement or -1), or
    None for a job on one device set. Raises for what staging does not
    support."""
    from .. import scope
    outer = scope.current_placement()  # function_config's default yields to scopes in the body
    stages = list(builder.placements)
    if not stages or (len(stages) == 1 and (outer is None or outer == stages[0])):
        return None
    default = -1
    if outer is not None:
        if outer not in stages:
            stages.append(outer)
        default = stages.index(outer)
    if len(stages) == 1:
        return None
    names = ", ".join(map(repr, stages))
    if any(p.device_tag != "cpu" for p in stages):
        raise NotImplementedError(
            f"job '{job}' places ops on different devices ({names}), but placement per layer "
            "runs on CPU devices only: a GPU stage needs copies between the GPU and the other "
            "stages' devices, which flowjit does not have yet; place every stage on \"cpu\" or "
            "the whole job on one GPU")
    rank, procs = process_info()
    if procs > 1:
        raise NotImplementedError(
            f"job '{job}' places ops on different devices ({names}) in a session over {procs} "
            "processes (flow.env); placement per layer needs the stages in one process: "
            "passing values between processes' stages is not done yet")
    local = local_device_count()
    for p in stages:
        for machine, devs in p.devices:
            if machine != 0:
                raise ValueError(f"job '{job}' places ops on machine {machine} ({p!r}), but this "
                                 "session runs on one machine, 0; use \"0:<device>\"")
            for d in devs:
                if d < 0 or d >= local:
                    raise ValueError(
                        f"job '{job}' places ops on CPU device {d} ({p!r}), but "
                        f"flow.config.cpu_device_num({local}) configures device"
                        f"{' 0' if local == 1 else f's 0 to {local - 1}'}")
    return stages, default


def _job_placement(job, config, builder):
    """The one placement of a job: function_config's default, a scope around
    the call, or scopes inside the body (all the same device set). None for a
    job placed on several device sets (job_stages)."""
    if job_stages(job, config, builder) is not None:
        return None
    if builder.placements:
        return builder.placements[0]
    return _outer_placement(config)


def _stage_distribution(job, config, builder, params, staged):
    from .. import scope
    stages, default = staged
    if config.get("default_logical_view") == scope.mirrored_view():
        raise NotImplementedError(
            f"job '{job}' places ops on different devices in the mirrored view; placement per "
            "layer takes the consistent view (the default): every input is the whole batch")
    for name, ph in params:
        if ph.kind != "Numpy":
            raise NotImplementedError(
                f"job '{job}': parameter '{name}' is a {ph.kind} placeholder, but a job placed on "
                "several device sets takes whole inputs: use tp.Numpy.Placeholder")
    ids = [sorted({d for _, devs in p.devices for d in devs}) for p in stages]
    return {"parts": 1, "mirrored": False, "split_vars": _session_splits(job, builder),
            "whole_outputs": False, "stages": ids, "default_stage": default}


def _check_mirrored_params(job, params, over):
    for name, ph in params:
        if ph.kind != "ListNumpy":
            raise NotImplementedError(
                f"job '{job}': parameter '{name}' is a {ph.kind} placeholder, but in the mirrored view "
                f"over {over} every input is per device: use tp.ListNumpy.Placeholder")


def distribution(job, config, builder, params):
    """The `distribution` argument of _C.compile_job, or None for one device."""
    from .. import scope
    staged = job_stages(job, config, builder)
    if staged is not None:
        return _stage_distribution(job, config, builder, params, staged)
    local = local_device_count()
    rank, procs = process_info()
    parts = local * procs
    placement = _job_placement(job, config, builder)
    if placement is not None:
        want = _placement_devices(job, placement)
        if want == 1:
            return None  # the job runs on one device; its variables come back to the host
        if placement.device_tag == "gpu":  # several GPUs, the consistent view
            ordinals = _gpu_ordinals(job, placement)
            usable = all(_C.gpu_status(o)["available"] for o in ordinals)
            if not usable and config.get("allow_cpu_fallback", False):
                return None  # job_target warns: the job runs on one CPU device
            mirrored = config.get("default_logical_view") == scope.mirrored_view()
            if mirrored:
                _check_mirrored_params(job, params, f"{want} GPUs")
            return {"parts": want, "mirrored": mirrored, "split_vars": _session_splits(job, builder),
                    "whole_outputs": procs > 1}
        if want != parts:
            raise NotImplementedError(
                f"job '{job}' is placed on {want} devices ({placement!r}) but the session has {parts} "
                f"({local} per process x {procs} process(es)); a job runs on one device or on all of them")
    if parts == 1:
        return None
    mirrored = config.get("default_logical_view") == scope.mirrored_view()
    if mirrored:
        _check_mirrored_params(job, params, f"{parts} devices")
    return {"parts": parts, "mirrored": mirrored, "split_vars": _session_splits(job, builder),
            "whole_outputs": procs > 1}
