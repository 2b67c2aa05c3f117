"""The guided BERT course (``notebooks/02_bert_course.ipynb``): its check cells.

``checks.py`` runs a student's answer on fixed inputs and says which mistake it found,
in words a student can act on. It imports only torch (inside the checks) and the standard
library: a check cell must work in any kernel that can run the lesson.
"""
