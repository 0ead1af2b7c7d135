"""MPS on a real GPU: memory per client, and GEMM throughput per share.

Run as root on the device machine, after nothing else uses the GPU. It starts
its own MPS control daemon (pipe and log under /tmp/mpsm) and always quits it.
"""
import json
import os
import subprocess
import sys
import time

CTL = os.environ.get("MPS_CONTROL", "/usr/local/nvidia/bin/nvidia-cuda-mps-control")
BASE = "/tmp/mpsm"
PIPE, LOG = BASE + "/pipe", BASE + "/log"


def smi(q):
    return subprocess.check_output(["nvidia-smi", q, "--format=csv,noheader,nounits"], text=True).strip()


def used():
    return int(smi("--query-gpu=memory.used").splitlines()[0])


def client(mode, seconds, hold_file):
    import torch
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    out = {"pid": os.getpid(), "sms": props.multi_processor_count, "free_mib": free >> 20, "total_mib": total >> 20,
           "pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")}
    if mode == "idle":
        x = torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        print(json.dumps(out), flush=True)
        while not os.path.exists(hold_file):
            time.sleep(0.2)
        return
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.half)
    b = torch.randn(n, n, device="cuda", dtype=torch.half)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    t0 = time.time()
    rates = []
    while time.time() - t0 < seconds:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(200):
            a @ b
        e.record()
        e.synchronize()
        rates.append(200 * 2 * n ** 3 / (s.elapsed_time(e) / 1e3) / 1e12)
    half = rates[len(rates) // 2:]
    out["tflops_median_second_half"] = round(sorted(half)[len(half) // 2], 1)
    out["batches"] = len(rates)
    print(json.dumps(out), flush=True)


def spawn(env_extra, mode, seconds=0, hold="/tmp/mpsm/hold"):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.Popen([sys.executable, __file__, "client", mode, str(seconds), hold], env=env,
                            stdout=subprocess.PIPE, text=True)


def idle_round(label, env_extra, n):
    hold = BASE + "/hold"
    if os.path.exists(hold):
        os.remove(hold)
    before = used()
    ps = [spawn(env_extra, "idle", hold=hold) for _ in range(n)]
    infos = [json.loads(p.stdout.readline()) for p in ps]
    time.sleep(1)
    after = used()
    apps = smi("--query-compute-apps=pid,process_name,used_memory")
    open(hold, "w").close()
    for p in ps:
        p.wait()
    print(f"IDLE {label} clients={n} used_before={before} used_with_clients={after} delta_per_client="
          f"{(after - before) / n:.0f} MiB; client view: sms={infos[0]['sms']} free={infos[0]['free_mib']} "
          f"total={infos[0]['total_mib']}", flush=True)
    print("  compute apps: " + apps.replace("\n", " | "), flush=True)


def gemm_round(label, envs, seconds):
    ps = [spawn(e, "gemm", seconds) for e in envs]
    res = [json.loads(p.stdout.readline()) for p in ps]
    for p in ps:
        p.wait()
    for r in res:
        print(f"GEMM {label}: pct={r['pct'] or '-'} sms={r['sms']} fp16 4096^3 TFLOP/s={r['tflops_median_second_half']}"
              f" (batches {r['batches']})", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        return client(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    os.makedirs(PIPE, exist_ok=True)
    os.makedirs(LOG, exist_ok=True)
    print("GPU:", smi("--query-gpu=name,memory.total,memory.used,compute_mode"), flush=True)
    only_ctx = len(sys.argv) > 1 and sys.argv[1] == "ctx"
    if only_ctx:
        mps = {"CUDA_MPS_PIPE_DIRECTORY": PIPE, "CUDA_MPS_LOG_DIRECTORY": LOG}
        denv = dict(os.environ, **mps)
        subprocess.run([CTL, "-d"], env=denv, check=True)
        try:
            time.sleep(1)
            for pct in ("10", "20", "35", "50", "75", "100"):
                idle_round("MPS " + pct + "%", dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=pct), 2)
        finally:
            subprocess.run([CTL], input="quit\n", env=denv, text=True)
        return
    idle_round("no MPS", {}, 1)
    idle_round("no MPS", {}, 4)
    gemm_round("whole GPU, no MPS", [{}], 8)
    mps = {"CUDA_MPS_PIPE_DIRECTORY": PIPE, "CUDA_MPS_LOG_DIRECTORY": LOG}
    denv = dict(os.environ, **mps)
    subprocess.run([CTL, "-d"], env=denv, check=True)
    try:
        time.sleep(1)
        for n in (1, 2, 4, 8):
            idle_round("MPS 100%", mps, n)
        idle_round("MPS 20%", dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="20"), 4)
        gemm_round("MPS alone", [dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100")], 8)
        gemm_round("MPS alone", [dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50")], 8)
        gemm_round("MPS alone", [dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="20")], 8)
        gemm_round("MPS together", [dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="20"),
                                    dict(mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50")], 12)
    finally:
        subprocess.run([CTL], input="quit\n", env=denv, text=True)
        time.sleep(2)
        print("MPS control log tail:", flush=True)
        subprocess.run(["tail", "-n", "15", LOG + "/control.log"])


if __name__ == "__main__":
    main()
