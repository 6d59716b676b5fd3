"""The rollout inspector's read side: what a person debugging a run looks at.

`run.inspect_run` gathers one run's header, where each of its two formats comes from (with
the loss report of a converted part), its drift check, its reward per step and one page of
its steps, each with the trajectory and the trace side by side and its findings marked.
`search.resolve` turns what a person pastes (a run id, a cid, an inference URL, a log
line) into the run or runs it names; `search.store_figures` gives the home page's
headline figures. Functions take a `Session` and never commit; the API's pages and its
`/v1/inspect` route render the same answers.
"""
