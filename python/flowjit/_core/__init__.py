"""flowjit's Python core, apart from the OneFlow-facing modules: tracing job
functions into the IR (trace, blob, dtypes, variables), compiling and calling
them (job, through flowjit._C), their results (futures), the compiled-job view
(compiled), the session, logging and the process's edges."""
