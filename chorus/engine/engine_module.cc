// engine module: sampler, requests, scheduler.
