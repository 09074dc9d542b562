"""The devices a job runs on: flow.config's device count, flow.env's
processes, the job's placement and logical view, turned into the
`distribution` the compiler takes (see jit/distribute.h)."""
from . import _C


def process_info():
    """(rank of this process, number of processes)."""
    from . import env
    return env._process_rank(), env._process_count()


def local_device_count():
    from . import config
    return config._settings["cpu_device_num"]


def ensure_configured():
    """Sets up this process's devices and their communicator once the
    settings are known (the first call of a job function)."""
    from . import env
    local = local_device_count()
    rank, procs = process_info()
    info = _C.device_info()
    if procs > 1:
        env._configure_processes(local)
    elif info["local_devices"] != local or info["several_processes"] or not info["ranks"]:
        _C.configure_devices(local)


def _placement_devices(job, placement):
    if placement.device_tag == "gpu":
        raise NotImplementedError(f"job '{job}' is placed on \"gpu\", but GPU placement from Python is "
                                  "not available yet; place it on \"cpu\"")
    return sum(len(devs) for _, devs in placement.devices)


def _job_placement(job, config, builder):
    """The one placement of a job: function_config's default, a scope around
    the call, or scopes inside the body (all the same device set)."""
    from . import scope
    found = set(builder.placements)
    if scope.current_placement() is not None:
        found.add(scope.current_placement())
    if len(found) > 1:
        raise NotImplementedError(
            f"job '{job}' places ops on different devices ({', '.join(sorted(map(repr, found)))}); "
            "placing parts of one job on different devices (pipelining) is not supported yet: "
            "a job runs on one device set")
    if found:
        return next(iter(found))
    return config.get("default_placement_scope")


def distribution(job, config, builder, params):
    """The `distribution` argument of _C.compile_job, or None for one device."""
    from . import scope
    local = local_device_count()
    rank, procs = process_info()
    parts = local * procs
    placement = _job_placement(job, config, builder)
    if placement is not None:
        want = _placement_devices(job, placement)
        if want == 1:
            return None  # the job runs on one device; its variables come back to the host
        if want != parts:
            raise NotImplementedError(
                f"job '{job}' is placed on {want} devices ({placement!r}) but the session has {parts} "
                f"({local} per process x {procs} process(es)); a job runs on one device or on all of them")
    if parts == 1:
        return None
    mirrored = config.get("default_logical_view") == scope.mirrored_view()
    if mirrored:
        for name, ph in params:
            if ph.kind != "ListNumpy":
                raise NotImplementedError(
                    f"job '{job}': parameter '{name}' is a {ph.kind} placeholder, but in the mirrored view "
                    f"over {parts} devices every input is per device: use tp.ListNumpy.Placeholder")
    return {"parts": parts, "mirrored": mirrored, "split_vars": dict(builder.split_vars),
            "whole_outputs": procs > 1}
