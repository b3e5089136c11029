"""Benchmarks: commands that measure side by side in one run and print the figures."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "BenchOptions": "trtspec.bench.runner", "run_bench": "trtspec.bench.runner",
    "format_bench_table": "trtspec.bench.bench_outputs:format_table",
    "write_bench_outputs": "trtspec.bench.bench_outputs:write_outputs",
    "CompareOptions": "trtspec.bench.compare", "run_compare": "trtspec.bench.compare",
    "DEFAULT_SETS": "trtspec.bench.compare", "render_compare_table": "trtspec.bench.compare:render_table",
    "write_compare_outputs": "trtspec.bench.compare:write_outputs",
    "perf_analyzer_command": "trtspec.bench.perf_analyzer:command",
    "perf_input_data": "trtspec.bench.perf_analyzer:input_data",
    "load_bench_prompts": "trtspec.bench.workload", "parse_slos": "trtspec.bench.summary",
    "SoakOptions": "trtspec.bench.soak", "run_soak": "trtspec.bench.soak",
    "format_soak_report": "trtspec.bench.soak_report:format_report",
    "QualityOptions": "trtspec.bench.quality", "measure_quality": "trtspec.bench.quality",
    "format_quality_report": "trtspec.bench.quality:format_report",
})
