"""The domain's words, defined once: the API group, the finalizer, the plan targets and the
UltraServer sizes. Everything else (the models, planning, the handlers, the Kueue controller)
imports them from here, so a new UltraServer type or target is one edit.
"""

from __future__ import annotations

GROUP = "hyperplan.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# kopf's finalizer and its annotations on our objects (operator.configure_kopf).
FINALIZER = f"{GROUP}/finalizer"
# The operator's own finalizer on a TrainingPlan that may hold reservations (handlers.trainingplan).
# Not kopf's: kopf removes its finalizer from objects of a kind it has no deletion handler for.
PLAN_FINALIZER = f"{GROUP}/release-reservations"
ANNOTATION_PREFIX = GROUP

# What a training plan's capacity serves (DESIGN.md section 1): a plan serves one, not both.
TRAINING_JOB = "training-job"
HYPERPOD_CLUSTER = "hyperpod-cluster"
TARGET_RESOURCES = (TRAINING_JOB, HYPERPOD_CLUSTER)
# A hyperpod-cluster plan's blocks all lie in one AZ; a training-job plan's blocks may not.
SINGLE_AZ_TARGETS = frozenset({HYPERPOD_CLUSTER})

# Instances per UltraServer, by UltraServer type.
ULTRASERVER_INSTANCES = {"ml.u-p6e-gb200x72": 18, "ml.u-p6e-gb200x36": 9}
ULTRASERVER_TYPES = tuple(ULTRASERVER_INSTANCES)

# The Kueue AdmissionCheck controller's name (docs/admission.md).
ADMISSION_CONTROLLER_NAME = f"{GROUP}/training-plan"
