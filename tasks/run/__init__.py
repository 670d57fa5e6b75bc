"""One run (one seed): its spec and Params, the train and evaluation groups, the steps around
its jobs (`stages`), the waits for a planned checkpoint (`operators`, `triggers`). A run
folder's life, stage by stage, with the function that does each: docs/run-folder.md."""
