"""One run (one seed): its spec and Params, the train and evaluation groups, the steps around
its jobs (`steps`)."""
