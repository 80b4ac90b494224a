"""The in-sandbox agent: a small HTTP/1.1 server over a Unix socket or TCP.

It runs from the read-only interpreter bundle mounted into the sandbox, so it must use the
standard library only and import as little as possible (every sandbox pays for its heap).
One thread per connection; one blocking ``waitpid`` per command; orphans are reaped on SIGCHLD
(with a once-a-second sweep as a safety net).

Wire protocol (the orchestrator's ``agent.client`` is the other side):
  GET  /health                          -> {"status": "ok", "pid", "processes"}
  POST /exec        {argv, cwd, env, stdin_b64, timeout, max_output_bytes, stream}
                    -> {exit_code, stdout|stdout_b64, stderr|stderr_b64, *_dropped, timed_out,
                        started_at, completed_at}; with stream=true chunked NDJSON events
  POST /processes   {argv, cwd, env}    -> process info ; GET /processes, GET|DELETE /processes/ID
  GET  /processes/ID/output?stdout_offset=&stderr_offset=
  PUT  /files?path=&mode=  (raw body)   GET /files?path= (raw)   DELETE /files?path=&recursive=
  GET  /files/list?path=                POST /files/mkdir?path=
  POST /patch       {patch, cwd, timeout}
  GET  /archive?path=P&path=Q[&max_bytes=N][&freeze=1]  -> chunked tar (PAX, numeric owners,
                    symlinks kept as symlinks) of the paths that exist; 413 before any byte is
                    sent when their regular files add up to more than max_bytes; freeze stops
                    the running processes until the archive is complete
  PUT  /archive     (tar body)          -> {paths, files}: each tree in it replaces what is at
                    its path (a directory's contents, when it is a mount point), with owners,
                    modes and mtimes; members with '..' or writing through its own symlinks: 400
  POST /signal      {signal: STOP|CONT} -> {signalled, not_permitted}: every process of the
                    sandbox but the agent (pause and resume where there is no cgroup freezer)
  GET  /pty?argv=JSON&cols=&rows=  with "Upgrade: orchard-pty" -> 101, then framed bytes both
                    ways: [type u8][len u32][payload]; types: 0 data, 1 resize "cols,rows",
                    2 exit "code".
Errors are JSON {"detail": "..."} with a 4xx/5xx status. A request with "Expect: 100-continue"
gets "100 Continue" only once the agent is ready to read its body, so a refused upload is
never sent; one request never gets two answers (an error after a response closes instead).

The package imports only the standard library and its own modules: inside the sandbox it is
loaded by ``boot.py`` as the top-level package ``orchard_agent``, with no ``orchard`` around it.
"""
