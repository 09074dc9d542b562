"""OneFlow's session queries, settings and support modules on flowjit:
flow.unittest, dtype helpers, eager switches, flow.config / flow.env names,
function_config hints and function_desc, sysconfig, profiler, util,
deprecated, generators."""
import logging
import os
import unittest as std_unittest

import numpy as np
import pytest

import flowjit as flow
import flowjit.typing as tp


# ---------------------------------------------------------------- flow.unittest

def test_unittest_env_reads_oneflow_test_variables(monkeypatch):
    for v in ("ONEFLOW_TEST_DEVICE_NUM", "ONEFLOW_TEST_NODE_LIST", "ONEFLOW_TEST_WORLD_SIZE",
              "ONEFLOW_TEST_ENABLE_EAGER", "ONEFLOW_TEST_ENABLE_TYPING_CHECK"):
        monkeypatch.delenv(v, raising=False)
    e = flow.unittest.env
    assert (e.device_num(), e.node_size(), e.has_node_list(), e.has_world_size()) == (1, 1, False, False)
    assert not e.eager_execution_enabled() and not e.typing_check_enabled()
    with pytest.raises(ValueError, match="ONEFLOW_TEST_NODE_LIST is not set"):
        e.node_list()
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "4")
    monkeypatch.setenv("ONEFLOW_TEST_NODE_LIST", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("ONEFLOW_TEST_WORLD_SIZE", "8")
    assert (e.device_num(), e.node_size(), e.node_list(), e.world_size()) == (4, 2, ["10.0.0.1", "10.0.0.2"], 8)
    monkeypatch.setenv("ONEFLOW_TEST_WORLD_SIZE", "eight")
    with pytest.raises(ValueError, match="ONEFLOW_TEST_WORLD_SIZE must be a number"):
        e.has_world_size()


def test_skip_unless_follows_the_layout(monkeypatch):
    monkeypatch.delenv("ONEFLOW_TEST_NODE_LIST", raising=False)
    monkeypatch.delenv("ONEFLOW_TEST_DEVICE_NUM", raising=False)

    def f():
        return 1
    assert flow.unittest.skip_unless_1n1d()(f) is f
    skipped = flow.unittest.skip_unless_1n2d()(f)
    assert getattr(skipped, "__unittest_skip__", False)
    assert "node_size is 1 and device_num is 2" in skipped.__unittest_skip_why__
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "2")
    assert flow.unittest.skip_unless_1n2d()(f) is f
    assert getattr(flow.unittest.skip_unless_1n1d()(f), "__unittest_skip__", False)


def test_testcase_starts_each_test_with_a_clean_session():
    results = []

    class T(flow.unittest.TestCase):
        def test_a(self):
            results.append(sorted(flow.get_all_variables()))

        def test_b(self):
            flow.clear_default_session()  # OneFlow's tests often clear it again themselves
            results.append(sorted(flow.get_all_variables()))

    @flow.global_function()
    def make_var(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return x + flow.get_variable("unittest_v", shape=(1,), initializer=flow.ones_initializer())

    make_var(np.zeros(1, np.float32))
    assert "unittest_v" in flow.get_all_variables()
    suite = std_unittest.TestLoader().loadTestsFromTestCase(T)
    outcome = std_unittest.TestResult()
    suite.run(outcome)
    assert outcome.wasSuccessful(), outcome.errors + outcome.failures
    assert results == [[], []]


def test_testcase_refuses_eager_tests(monkeypatch):
    monkeypatch.setenv("ONEFLOW_TEST_ENABLE_EAGER", "1")

    class T(flow.unittest.TestCase):
        def test_x(self):
            pass

    outcome = std_unittest.TestResult()
    std_unittest.TestLoader().loadTestsFromTestCase(T).run(outcome)
    assert len(outcome.errors) == 1 and "flowjit has no eager mode" in outcome.errors[0][1]


def test_register_test_cases_and_num_nodes_required(tmp_path):
    (tmp_path / "test_one.py").write_text(
        "import flowjit as flow\n"
        "def test_single(test_case):\n    test_case.assertEqual(1, 1)\n"
        "@flow.unittest.num_nodes_required(2)\n"
        "def test_double(test_case):\n    pass\n")
    (tmp_path / "helper.py").write_text("raise AssertionError('not a test file')\n")
    scope = {}
    flow.unittest.register_test_cases(scope, str(tmp_path), lambda n: n == 1)
    cls = scope["test_one"]
    assert issubclass(cls, std_unittest.TestCase)
    assert hasattr(cls, "test_single") and not hasattr(cls, "test_double")
    outcome = std_unittest.TestResult()
    std_unittest.TestLoader().loadTestsFromTestCase(cls).run(outcome)
    assert outcome.wasSuccessful() and outcome.testsRun == 1
    with pytest.raises(ValueError, match="positive int"):
        flow.unittest.num_nodes_required(0)


# ---------------------------------------------------------------- dtypes, eager, scope

def test_dtypes_and_numpy_conversion():
    assert flow.float in flow.dtypes() and flow.int8 in flow.dtypes() and flow.float16 in flow.dtypes()
    conv = flow.convert_oneflow_dtype_to_numpy_dtype
    assert conv(flow.float) is np.float32 and conv(flow.double) is np.float64
    assert conv(flow.char) is np.int8 and conv(flow.int64) is np.int64 and conv(flow.float16) is np.float16
    assert np.zeros(2, dtype=conv(flow.uint8)).dtype == np.uint8
    with pytest.raises(TypeError, match="expected a flow dtype such as flow.float32, got 'float32'"):
        conv("float32")


def test_eager_execution_is_refused():
    assert flow.eager_execution_enabled() is False
    flow.enable_eager_execution(False)
    with pytest.raises(NotImplementedError, match=r"enable_eager_execution\(True\): flowjit has no eager"):
        flow.enable_eager_execution()
    with pytest.raises(TypeError, match="expected True or False"):
        flow.enable_eager_execution(1)


def test_current_scope_and_function_desc_inside_a_job():
    seen = {}
    cfg = flow.FunctionConfig()
    cfg.default_placement_scope(flow.scope.placement("cpu", "0:0"))

    @flow.global_function(type="predict", function_config=cfg)
    def probe(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["tag"] = flow.current_scope().device_parallel_desc_symbol.device_tag
        with flow.scope.namespace("outer"):
            seen["ns"] = flow.scope.current_scope().name_scopes
        seen["trainable"] = flow.current_global_function_desc().IsTrainable()
        seen["job"] = flow.current_global_function_desc().job_name
        return x + 1

    np.testing.assert_allclose(probe(np.ones(2, np.float32)), [2, 2])
    assert seen == {"tag": "cpu", "ns": ["outer"], "trainable": False, "job": "probe"}
    with flow.scope.placement("gpu", "0:0-1"):
        desc = flow.scope.current_scope().device_parallel_desc_symbol
        assert (desc.device_tag, desc.machine_id2device_id_list, desc.parallel_num) == ("gpu", {0: [0, 1]}, 2)
    with pytest.raises(RuntimeError, match="only be used inside a function decorated"):
        flow.current_global_function_desc()
    assert flow.current_machine_id() == 0
    assert flow.is_deprecated(flow.current_scope) and not flow.is_deprecated(flow.scope.current_scope)
    assert not flow.is_deprecated(None)


# ---------------------------------------------------------------- flow.config / flow.env

def test_config_runtime_settings_are_checked_and_recorded(monkeypatch, caplog):
    monkeypatch.setenv("FLOWJIT_DEBUG", "1")
    monkeypatch.setattr(flow.config, "_said", set())
    with caplog.at_level(logging.INFO, logger="flowjit"):
        flow.config.use_rdma(False)
        flow.config.use_rdma(False)
        flow.config.reserved_device_mem_mbyte(512)
        flow.config.collective_boxing.nccl_enable_all_to_all(True)
        flow.config.nccl_use_compute_stream(True)
    said = [r.getMessage() for r in caplog.records]
    assert sum("config.use_rdma(False) is ignored: flowjit does not use RDMA" in m for m in said) == 1
    ignored = flow.config.current_resource().ignored
    assert ignored["reserved_device_mem_mbyte"] == 512
    assert ignored["collective_boxing.nccl_enable_all_to_all"] is True
    with pytest.raises(TypeError, match=r"^config\.use_rdma: expected True or False, got 1$"):
        flow.config.use_rdma(1)
    with pytest.raises(ValueError, match=r"^config\.reserved_host_mem_mbyte: expected a non-negative int"):
        flow.config.reserved_host_mem_mbyte(-1)
    with pytest.raises(ValueError, match=r"collective_boxing\.nccl_num_streams: expected a non-negative int"):
        flow.config.collective_boxing.nccl_num_streams("2")
    monkeypatch.delenv("FLOWJIT_DEBUG")


def test_config_settings_that_act():
    r = flow.current_resource()
    assert (r.machine_num, r.cpu_device_num) == (1, flow.config.device_count())
    flow.config.machine_num(1)
    with pytest.raises(ValueError, match=r"config\.machine_num\(2\): this job runs over 1 process"):
        flow.config.machine_num(2)
    with pytest.raises(NotImplementedError, match="flowjit cannot load custom C\\+\\+ ops"):
        flow.config.load_library("libcustom.so")
    with pytest.raises(TypeError, match="expected the path"):
        flow.config.load_library_now(3)
    assert flow.config.legacy_model_io_enabled() in (True, False)
    saved = os.environ.get("FLOWJIT_ALLOW_TF32")
    try:
        flow.config.enable_tensor_float_32_compute(True)
        assert os.environ["FLOWJIT_ALLOW_TF32"] == "1"
        flow.config.enable_tensor_float_32_compute(False)
        assert os.environ["FLOWJIT_ALLOW_TF32"] == "0"
    finally:
        if saved is None:
            os.environ.pop("FLOWJIT_ALLOW_TF32", None)
        else:
            os.environ["FLOWJIT_ALLOW_TF32"] = saved
    threads = flow._C.num_threads()
    flow.config.compute_thread_pool_size(1)
    assert flow.current_resource().compute_thread_pool_size == 1
    flow.config.cpu_threads(threads)


def test_env_names():
    assert flow.env.init() is True
    p = flow.env.all_device_placement("cpu")
    assert p.device_tag == "cpu" and p.devices == [(0, list(range(flow.config.device_count())))]
    with pytest.raises(ValueError, match="no GPUs are configured"):
        flow.env.all_device_placement("cuda")
    with pytest.raises(ValueError, match="device_type must be"):
        flow.env.all_device_placement("tpu")
    assert flow.env.current_resource() == flow.current_resource()
    flow.env.data_port(12345)
    flow.env.log_dir("/tmp/flowjit-logs")
    flow.env.logtostderr(1)
    flow.env.logbuflevel(0)
    flow.env.grpc_use_no_signal()
    with pytest.raises(ValueError, match="port number"):
        flow.env.data_port(70000)
    with pytest.raises(TypeError, match="expected an int"):
        flow.env.logtostderr("yes")
    with pytest.raises(NotImplementedError, match="several processes per host"):
        flow.env.init_bootstrap_confs(["127.0.0.1"], 29500, world_size=4)


# ---------------------------------------------------------------- function_config

def test_function_config_hints_and_function_desc():
    cfg = flow.FunctionConfig()
    assert cfg.function_desc.enable_inplace is True  # OneFlow's default
    cfg.enable_inplace(False)
    cfg.enable_fuse_cast_scale()
    cfg.prune_parallel_cast_ops(True)
    cfg.concurrency_width(1)
    cfg.optimizer_placement_optimization_mode("distributed_split")
    cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["embeddings"])))
    cfg.enable_qat(False)
    cfg.qat.symmetric(True)
    desc = cfg.function_desc
    assert desc.enable_inplace is False and desc.enable_fuse_cast_scale is True
    assert desc.concurrency_width == 1 and desc.enable_reused_mem is True
    assert desc.indexed_slices_optimizer_conf == {"include_op_names": {"op_name": ["embeddings"]}}
    assert cfg.get("qat.symmetric") is True
    with pytest.raises(AttributeError, match="read-only"):
        desc.enable_inplace = True
    with pytest.raises(AttributeError, match="function_desc has no setting 'nope'"):
        desc.nope
    with pytest.raises(TypeError, match=r"^function_config\.concurrency_width: expected an int"):
        cfg.concurrency_width("1")
    with pytest.raises(ValueError, match="optimizer_placement_optimization_mode: expected one of"):
        cfg.optimizer_placement_optimization_mode("zero")
    with pytest.raises(ValueError, match="include_op_names must be dict"):
        cfg.indexed_slices_optimizer_conf(dict(include_op_names=["embeddings"]))
    with pytest.raises(NotImplementedError, match=r"enable_qat\(True\): flowjit has no quantization-aware"):
        cfg.enable_qat(True)
    with pytest.raises(TypeError, match=r"qat\.symmetric: expected bool"):
        cfg.qat.symmetric("yes")
    with pytest.raises(NotImplementedError, match="default_initializer_conf is a OneFlow setting"):
        cfg.default_initializer_conf({})


def test_hinted_job_computes_the_same():
    cfg = flow.FunctionConfig()
    cfg.enable_fuse_cast_scale(True)
    cfg.enable_reused_mem(False)
    cfg.cudnn_conv_force_fwd_algo(1)

    @flow.global_function(function_config=cfg)
    def scaled(x: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        return flow.cast(x, flow.float) * 0.5

    np.testing.assert_allclose(scaled(np.arange(4, dtype=np.int32)), np.arange(4) * 0.5)


# ---------------------------------------------------------------- sysconfig, profiler, util, deprecated

def test_sysconfig_answers_for_flowjit():
    assert flow.sysconfig.with_cuda() is True and flow.sysconfig.with_xla() is False
    assert flow.sysconfig.has_rpc_backend_grpc() is False and flow.sysconfig.has_rpc_backend_local() is True
    lib = flow.sysconfig.get_lib()
    assert os.path.isfile(os.path.join(lib, flow.sysconfig.get_link_flags()[1][3:]))
    with pytest.raises(NotImplementedError, match="installs no C\\+\\+ headers"):
        flow.sysconfig.get_include()
    with pytest.raises(NotImplementedError, match="installs no C\\+\\+ headers"):
        flow.sysconfig.get_compile_flags()


def test_profiler_marks_are_identities_and_ranges_pair():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("prof_w", shape=(3,), initializer=flow.ones_initializer())
        y = flow.profiler.nvtx_start(x * w, mark_prefix="body")
        y = flow.math.relu(y)
        y = flow.profiler.nvtx_end(y, mark_prefix="body")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(y)
        return y

    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    np.testing.assert_allclose(job(x), np.maximum(x, 0))
    flow.profiler.range_push("outer")
    flow.profiler.range_pop()
    with pytest.raises(RuntimeError, match="no range is open"):
        flow.profiler.range_pop()


def test_unique_str_and_deprecated_module():
    a, b = flow.util.unique_str("Op_"), flow.util.unique_str("Op_")
    assert a != b and a.startswith("Op_") and b.startswith("Op_")

    class Twice(flow.deprecated.nn.Module):
        def forward(self, x):
            return (x * 2, self.call_seq_no)

    m = Twice()
    assert m.module_name.startswith("Module_")
    assert m(3) == (6, 0) and m(4) == (8, 1) and m.call_seq_no == 2
    with pytest.raises(NotImplementedError, match="defines no forward"):
        flow.deprecated.nn.Module("bare")(1)


# ---------------------------------------------------------------- generators

def test_generators_hold_seeds():
    g = flow.Generator(device="cpu")
    g.manual_seed(7)
    assert g.initial_seed() == 7
    assert g.seed() == g.initial_seed()
    flow.manual_seed(10)
    gens = [flow.default_generator(), flow.default_generator("cpu"), flow.default_generator("cuda:0")]
    assert [x.initial_seed() for x in gens] == [10, 10, 10]
    gens[0].manual_seed(3)
    assert gens[2].initial_seed() == 3
    with pytest.raises(ValueError, match="unimplemented"):
        flow.Generator(device="invalid")
    with pytest.raises(ValueError, match="does not exist"):
        flow.default_generator("cpu:1000")
    with pytest.raises(TypeError, match="expected an int"):
        g.manual_seed(1.5)
    flow.manual_seed(0)
