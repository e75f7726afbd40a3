"""Host-overhead probe on the GPU box: where the per-call time goes, and whether CUDA graphs capture the ops."""
import cProfile, pstats, time, io, json, os
import torch
from fovi_lab.layers import layer_meta
from fovi_lab.knn_warp import WarpTrainOps
from fovi_lab import warp_forward as F
dev = torch.device("cuda")
out = {}
for name, b in [("res18_layer1", 16), ("res18_layer1", 64), ("alex_L4", 16)]:
    meta = layer_meta(name, "rf2", device=dev)
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(b, meta.cin, meta.nin, generator=g0).to(dev, torch.float16)
    w = (0.02 * torch.randn(meta.cout, meta.q, generator=g0)).to(dev, torch.float16)
    g = torch.randn(b, meta.cout, meta.nout, generator=g0).to(dev, torch.float16)
    step = lambda: (WarpTrainOps.forward(meta, x, w, None),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))
    fwd = lambda: WarpTrainOps.forward(meta, x, w, None)
    for _ in range(5): step()
    torch.cuda.synchronize()
    rec = {}
    for label, fn in (("fwd", fwd), ("step", step)):
        N = 300
        t0 = time.perf_counter()
        for _ in range(N): fn()
        t_host = (time.perf_counter() - t0) / N * 1e3
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for _ in range(N): fn()
        torch.cuda.synchronize()
        t_all = (time.perf_counter() - t1) / N * 1e3
        rec[label] = dict(host_issue_ms=t_host, pipelined_ms=t_all)
    # cuda graph of the whole step
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
        graph.replay(); torch.cuda.synchronize()
        ref = step(); torch.cuda.synchronize()
        same = all(torch.equal(a, r) for a, r in zip(outs, ref))
        N = 300
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(N): graph.replay()
        torch.cuda.synchronize()
        rec["graph"] = dict(replay_ms=(time.perf_counter() - t0) / N * 1e3, matches_eager=same)
    except Exception as exc:
        rec["graph"] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
    out[f"{name} B={b}"] = rec
    print(name, b, json.dumps(rec), flush=True)
    if (name, b) == ("res18_layer1", 16):
        for label, fn in (("fwd", fwd), ("step", step)):
            pr = cProfile.Profile(); pr.enable()
            for _ in range(300): fn()
            pr.disable(); torch.cuda.synchronize()
            sio = io.StringIO(); pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(22)
            print(f"---- cProfile {label} (300 calls)\n" + "\n".join(sio.getvalue().splitlines()[6:34]))
import sys, warp
env = dict(device=torch.cuda.get_device_name(dev), warp=warp.config.version, torch=torch.__version__,
           cuda=torch.version.cuda, python=sys.version.split()[0], date=time.strftime("%Y-%m-%d"))
json.dump(dict(env, script="tools/h200/host_probe.py", results=out), open(os.environ["OUT"] + "/probe.json", "w"),
          indent=1)
