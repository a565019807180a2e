"""GPU and NeuronCore figures from the vendors' own streaming tools, started once: `nvidia-smi
--loop-ms` and `neuron-monitor` print a reading every period, so the sampler never pays a
tool's start-up (~50 ms of CPU for nvidia-smi) each second. The latest reading is kept.
"""

from __future__ import annotations

import json
import os


GPU_QUERY = "index,utilization.gpu,memory.used,power.draw"


def build_nvidia_smi_argv(interval_s: float) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits",
            f"--loop-ms={max(100, int(interval_s * 1000))}"]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpu_line(line: str) -> tuple[int, dict] | None:
    """(GPU index, {util, mem_mb, power_w}) from one csv line of build_nvidia_smi_argv's."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 4 or not fields[0].isdigit():
        return None
    util, mem, power = (_number(f) for f in fields[1:])
    return int(fields[0]), {"util": util, "mem_mb": mem, "power_w": power}


def build_neuron_monitor_config(interval_s: float) -> dict:
    period = f"{max(1, round(interval_s))}s"
    return {"period": period, "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]}],
            "system_metrics": []}


def parse_neuron_report(text: str) -> list[float | None] | None:
    """Each NeuronCore's use (%) in one neuron-monitor JSON report, by core index; None when
    the line is not one."""
    try:
        report = json.loads(text)
        cores: dict[int, float] = {}
        for runtime in report.get("neuron_runtime_data") or []:
            counters = runtime["report"]["neuroncore_counters"]["neuroncores_in_use"]
            for index, values in counters.items():
                cores[int(index)] = float(values["neuroncore_utilization"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not cores:
        return []
    return [cores.get(i) for i in range(max(cores) + 1)]


class StreamingTool:
    """A vendor tool printing a reading per line; the sampler's thread reads what it printed so
    far at each sample (read_available), so `latest` holds the last reading parsed then. No
    thread of its own: its pipe is read without blocking. Its CPU counts as the sampler's
    (cpu_s)."""

    def __init__(self, argv: list[str], take_line, cleanup: str | None = None):
        import subprocess

        self.latest = None
        self._take_line = take_line
        self._cleanup = cleanup
        self._partial = b""
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        os.set_blocking(self.proc.stdout.fileno(), False)

    def read_available(self) -> None:
        """Every whole line the tool printed since the last call, each taken in order."""
        fd = self.proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                return
            if not chunk:
                break
            self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            self._take_line(self, line.decode("utf-8", "replace"))

    def cpu_s(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def stop(self) -> None:
        """The tool only reads the devices: it is ended outright (SIGKILL), and collected."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        if self._cleanup:
            try:
                os.unlink(self._cleanup)
            except OSError:
                pass


class GpuReadings:
    """nvidia-smi's lines arrive one GPU at a time: a reading is complete at the next index 0."""

    def __init__(self) -> None:
        self.filling: dict[int, dict] = {}

    def take(self, tool: StreamingTool, line: str) -> None:
        parsed = parse_gpu_line(line)
        if parsed is None:
            return
        index, values = parsed
        if index in self.filling:
            tool.latest = [self.filling[i] for i in sorted(self.filling)]
            self.filling = {}
        self.filling[index] = values


def start_tools(interval_s: float, gpu_count: int, neuron_cores: int) -> dict[str, StreamingTool]:
    """The streaming tools this machine has and needs: none on a CPU machine (which imports
    none of shutil, subprocess, tempfile here: a 1-host CPU run's start-up stays lean)."""
    tools = {}
    if not gpu_count and not neuron_cores:
        return tools
    import shutil
    import tempfile

    try:
        if gpu_count and shutil.which("nvidia-smi"):
            tools["gpu"] = StreamingTool(build_nvidia_smi_argv(interval_s), GpuReadings().take)
        if neuron_cores and shutil.which("neuron-monitor"):
            fd, config = tempfile.mkstemp(prefix="byoc-neuron-monitor-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(build_neuron_monitor_config(interval_s), f)
            tools["neuron"] = StreamingTool(["neuron-monitor", "-c", config], _take_neuron_line, cleanup=config)
    except OSError:
        pass  # a tool that cannot start: those figures are left out
    return tools


def _take_neuron_line(tool: StreamingTool, line: str) -> None:
    cores = parse_neuron_report(line)
    if cores is not None:
        tool.latest = cores
