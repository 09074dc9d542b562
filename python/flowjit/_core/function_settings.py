"""OneFlow's function_config settings that flowjit accepts as hints, and the
read-only views of a config (function_desc, current_global_function_desc).

A hint tunes a part of OneFlow (cuDNN, NCCL, its graph-rewrite passes,
memory planning) that flowjit does not have or does its own way; the job
computes the same either way. Settings that would change what a job
computes (mixed precision, quantization-aware training) are refused with
NotImplementedError instead.
"""
import numbers

_NO_CUDNN = "flowjit has no cuDNN kernels; it generates its own"
_NO_HALF = "flowjit has no cuDNN; its half-precision convolutions and matmuls accumulate in float32"
_NO_NCCL = "flowjit's collectives use no NCCL and no all-reduce groups"
_OWN_PASSES = "OneFlow graph-rewrite pass; flowjit's optimizer has its own passes"
_MEMORY = "flowjit plans memory reuse itself"
# A reason that starts with USED: the setting is not a mere hint, flowjit acts on it.
USED = "used: "

# name -> (kind, default of the setter's argument, OneFlow's default value, why).
# kind: bool, int, float, or a tuple of the strings accepted.
HINTS = {
    "enable_inplace": (bool, True, True, _MEMORY),
    "enable_reused_mem": (bool, True, True, _MEMORY),
    "enable_inplace_in_reduce_struct": (bool, True, True, _MEMORY),
    "enable_fuse_add_to_output": (bool, True, False, "flowjit fuses elementwise epilogues itself"),
    "enable_fuse_cast_scale": (bool, True, False, "flowjit fuses elementwise ops itself"),
    "enable_fuse_model_update_ops": (bool, True, False, "flowjit always fuses optimizer updates"),
    "enable_gradients_stats_aggregation": (bool, True, True, "flowjit fuses elementwise ops itself"),
    "enable_xla_jit": (bool, True, False, "flowjit is its own JIT"),
    "use_xla_jit": (bool, True, False, "flowjit is its own JIT"),
    "use_tensorrt": (bool, True, False, "flowjit is its own JIT"),
    "enable_cudnn": (bool, True, True, _NO_CUDNN),
    "cudnn_conv_heuristic_search_algo": (bool, True, True, _NO_CUDNN),
    "cudnn_conv_use_deterministic_algo_only": (bool, True, False, _NO_CUDNN),
    "enable_cudnn_fused_normalization_add_relu": (bool, True, False, _NO_CUDNN),
    "cudnn_buf_limit_mbyte": (int, None, 1024, _NO_CUDNN),
    "cudnn_conv_force_fwd_algo": (int, None, None, _NO_CUDNN),
    "cudnn_conv_force_bwd_data_algo": (int, None, None, _NO_CUDNN),
    "cudnn_conv_force_bwd_filter_algo": (int, None, None, _NO_CUDNN),
    "cudnn_conv_enable_true_half": (bool, True, False, _NO_HALF),
    "cudnn_conv_enable_pseudo_half": (bool, True, True, _NO_HALF),
    "enable_float_compute_for_half_gemm": (bool, True, True, _NO_HALF),
    "enable_nccl": (bool, True, True, _NO_NCCL),
    "use_nccl_inter_node_communication": (bool, True, False, _NO_NCCL),
    "use_boxing_v2": (bool, True, True, _NO_NCCL),
    "enable_all_reduce_group": (bool, True, True, _NO_NCCL),
    "disable_all_reduce_sequence": (bool, True, False, _NO_NCCL),
    "all_reduce_fp16": (bool, True, False, _NO_NCCL),
    "all_reduce_group_num": (int, None, None, _NO_NCCL),
    "all_reduce_group_min_mbyte": (int, None, None, _NO_NCCL),
    "all_reduce_lazy_ratio": (float, None, None, _NO_NCCL),
    "all_reduce_group_size_warmup": (float, None, None, _NO_NCCL),
    "do_parallel_cast_before_widening_type_cast": (bool, True, True, _OWN_PASSES),
    "prune_parallel_cast_ops": (bool, True, True, _OWN_PASSES),
    "prune_cast_to_static_shape_ops": (bool, True, True, _OWN_PASSES),
    "prune_amp_white_identity_ops": (bool, True, True, _OWN_PASSES),
    "allow_cpu_return_op": (bool, True, True, "flowjit returns results from any device"),
    "enable_keep_header_only": (bool, True, False, "deprecated in OneFlow itself, without effect"),
    "concurrency_width": (int, None, 128, "flowjit runs a session's jobs in call order on one worker"),
    "enable_non_distributed_optimizer": (bool, True, False,
                                         "the optimizer's placement does not change what it computes"),
    "optimizer_placement_optimization_mode": (("non_distributed", "distributed_split"), None, None,
                                              "the optimizer's placement does not change what it computes"),
    "optimizer_placement_optimization_threshold": (int, None, 1024,
                                                   "the optimizer's placement does not change what it computes"),
    "non_distributed_optimizer_group_size_mbyte": (int, None, None,
                                                   "the optimizer's placement does not change what it computes"),
    "enable_ssp": (bool, True, False,
                   USED + "in a train job each trainable variable's forward value lags the variable by "
                   "ssp_num_stages - ssp_stage_id - 1 steps (flow.experimental.scope.config), as OneFlow's "
                   "ssp_variable_proxy"),
    "indexed_slices_optimizer_conf": (dict, None, None,
                                      USED + "the named embedding tables are updated only in the rows the "
                                      "step's gradient touches (values and optimizer state), as OneFlow's "
                                      "sparse updates"),
}


def check_hint(name, value):
    """The checked value of hint `name` (TypeError or ValueError naming it)."""
    kind = HINTS[name][0]
    where = f"function_config.{name}"
    if kind is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected True or False, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{where}: expected an int, got {value!r}")
        value = int(value)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}: expected a number, got {value!r}")
        value = float(value)
    elif kind is dict:
        _check_indexed_slices(where, value)
    elif value not in kind:
        raise ValueError(f"{where}: expected one of {', '.join(map(repr, kind))}, got {value!r}")
    return value


def _check_indexed_slices(where, value):
    """OneFlow's IndexedSlicesOptimizerConf as a dict:
    {"include_op_names": {"op_name": [...]}, "enable": bool (optional)}."""
    if not isinstance(value, dict):
        raise TypeError(f"{where}: expected a dict such as dict(include_op_names=dict(op_name=['embeddings'])), "
                        f"got {value!r}")
    unknown = set(value) - {"enable", "include_op_names"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; expected include_op_names and enable")
    names = value.get("include_op_names")
    if not isinstance(names, dict) or set(names) - {"op_name"} or \
            not all(isinstance(n, str) for n in names.get("op_name", [])):
        raise ValueError(f"{where}: include_op_names must be dict(op_name=[variable names]), got {names!r}")
    if not isinstance(value.get("enable", True), bool):
        raise TypeError(f"{where}: enable must be True or False, got {value['enable']!r}")


# OneFlow's defaults of the settings flowjit implements, as function_desc shows them.
_DEFAULTS = {"default_data_type": None, "default_logical_view": None, "default_placement_scope": None,
             "enable_auto_mixed_precision": False, "enable_quantization_aware_training": False,
             "check_numerics": False, "allow_cpu_fallback": False, "enable_tensor_float_32_compute": None}


class FunctionDesc:
    """A read-only view of a function config (OneFlow's FunctionDesc):
    ``desc.enable_inplace`` is the value set, or OneFlow's default where
    none was; ``IsTrainable()`` says whether the job trains."""

    def __init__(self, config, job_name: str = None, job_type: str = None):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "job_name", job_name)
        object.__setattr__(self, "job_type", job_type)

    def IsTrainable(self) -> bool:  # noqa: N802 - OneFlow's name
        """True for a job of type "train" (None outside a job: the config alone does not say)."""
        return None if self.job_type is None else self.job_type == "train"

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        values = self._config._values
        if name in values:
            return values[name]
        if name in HINTS:
            return HINTS[name][2]
        if name in _DEFAULTS:
            return _DEFAULTS[name]
        raise AttributeError(f"function_desc has no setting '{name}'")

    def __setattr__(self, name, value):
        raise AttributeError("function_desc is read-only; set function_config's methods instead")

    def __repr__(self):
        job = f" of job '{self.job_name}'" if self.job_name else ""
        return f"<FunctionDesc{job}: {dict(self._config._values)!r}>"


class QatConfig:
    """function_config().qat.*: settings of quantization-aware training.

    They are kept with the config, but flowjit has no quantization-aware
    training: enable_qat(True) raises NotImplementedError, so they act on
    nothing."""

    _KINDS = {"per_channel_weight_quantization": bool, "symmetric": bool, "moving_min_max_momentum": float,
              "moving_min_max_stop_update_after_iters": int, "target_backend": str}

    def __init__(self, config):
        self._config = config

    def _set(self, name, value, kind):
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not ok:
            raise TypeError(f"function_config.qat.{name}: expected {kind.__name__}, got {value!r}")
        self._config._values[f"qat.{name}"] = value
        return self._config

    def per_channel_weight_quantization(self, value: bool = True):
        """Quantize weights per output channel (default: per tensor)."""
        return self._set("per_channel_weight_quantization", value, bool)

    def symmetric(self, value: bool = True):
        """Symmetric quantization ranges."""
        return self._set("symmetric", value, bool)

    def moving_min_max_momentum(self, value: float):
        """Momentum of the activations' moving min/max."""
        return self._set("moving_min_max_momentum", value, float)

    def moving_min_max_stop_update_after_iters(self, value: int):
        """Iterations after which the moving min/max stop changing."""
        return self._set("moving_min_max_stop_update_after_iters", value, int)

    def target_backend(self, value: str):
        """The inference backend the quantization is for."""
        return self._set("target_backend", value, str)
