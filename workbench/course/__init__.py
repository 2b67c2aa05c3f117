"""The guided BERT course (``notebooks/02_bert_course.ipynb``): its check cells.

``checks.py`` runs a student's answer on fixed inputs and says which mistake it found,
in words a student can act on, and records the verdict (``verdict()``, also for a
teacher's own checks) through ``workbench.classroom.client``: a local file, and in a class
on JupyterHub the teacher's page. It imports torch (inside the checks), the standard library
and that client (standard library only): a check cell must work in any kernel that can run
the lesson.
"""
