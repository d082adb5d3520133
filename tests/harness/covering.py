"""Covering designs: the fewest cases of a parameter grid that still pair every
level of each factor with every level of each other factor.

A bug that needs two factors' levels together (this optimizer on that lookup
path, that input kind on so many cores) shows in some case of a pairwise
design; one that needs three together is not what the grids of these tests
vary (each factor acts through what the others hand it: ids, their gradients,
the cores they come from).
"""
import itertools


def pairwise(cases, keep=()):
  """The cases of `cases` (tuples of factor levels, the valid ones of a
  grid) that cover every pair of levels of two factors that some case of
  `cases` holds: `keep` first (cases kept for their own sake: a bug they
  found, a test sharing their training), then greedily the case covering the
  most pairs not yet covered, in the order of `cases` on ties."""
  cases = list(cases)
  missing = set().union(*map(_pairs, cases))
  chosen = []
  for case in keep:
    assert case in cases, case
    chosen.append(case)
    missing -= _pairs(case)
  while missing:
    case = max(cases, key=lambda case: len(_pairs(case) & missing))
    chosen.append(case)
    missing -= _pairs(case)
  return chosen


def _pairs(case):
  return set(itertools.combinations(enumerate(case), 2))


# The migrated Keras layers' trainings (TFRS's and keras-rs's): each embedding
# optimizer by `model.fit` and by a custom loop, on one replica and on two.
LAYER_TRAININGS = pairwise(
    itertools.product(('sgd', 'adagrad', 'adam', 'ftrl'), ('fit', 'loop'),
                      (1, 2)))
