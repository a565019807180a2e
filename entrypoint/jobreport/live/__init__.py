"""The job watched live. Every interval, each host's new figures (its sampled points, its ranks'
new steps) reach the leader, which writes them as TensorBoard scalars and, every
BYOC_STATUS_INTERVAL_S, logs the status line:

    update.py       a host's update: what is new since the last one, bounded (build_update,
                    fit_update), and a worker's read back by the leader (parse_update)
    loop.py         this host's live thread (LiveLoop), started and ended with its part of the
                    job report (jobreport/host.py)
    view.py         the leader's view: every host's updates as scalars and texts (LiveView)
    tb_events.py    the TensorBoard events file those are written to
    status_line.py  the leader's status line

    a worker (job port)   LiveLoop.tick: build_update -> fit_update -> BYOC-HOST-LIVE to the leader
    the leader / 1 host   LiveLoop.tick: build_update (its own) + the workers' (parse_update)
                          -> LiveView.take -> events file, status line
"""
