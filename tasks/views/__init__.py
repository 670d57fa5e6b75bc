"""Views of what lies on storage: the RCP index of runs and submissions (`storage_index`), the
convergence plot (`convergence`) and the HTML report (`html_report`); read by the RCP view and
the submission report."""
