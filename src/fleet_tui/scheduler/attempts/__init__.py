"""The life of one attempt: launching or adopting it, taking its events, reaping it.

``launch`` prepares and starts an attempt, ``adopt`` takes over one an engine left behind,
``running`` is what an engine holds while it runs, ``sink``/``eventwriter``/``ratelimits`` take
what its agent says, and ``finish`` reaps it (verify, decide, record).
"""
