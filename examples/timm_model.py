"""Any timm image model: `perflab run --workload examples/timm_model.py --option model=convnext_tiny`.

Random weights (nothing is downloaded), synthetic images pre-staged on the device. Needs
`pip install 'perflab[models]'`. Options: model (default resnet50), image_res, classes.
"""
from torch import nn

import perflab
from perflab.workloads.resnet50 import RandomImages

IMAGE_RES = {"cpu": 64, "cuda": 224}


def build(cfg) -> perflab.Workload:
    try:
        import timm
    except ImportError:
        raise perflab.PerflabError("examples/timm_model.py needs timm: pip install 'perflab[models]'") from None
    options = cfg.workload_options
    name = options.get("model", "resnet50")
    image_res = int(options.get("image_res", IMAGE_RES[cfg.device]))
    classes = int(options.get("classes", 1000))
    try:
        model = timm.create_model(name, pretrained=False, num_classes=classes)
    except RuntimeError as err:  # timm's "Unknown model (...)"
        raise perflab.PerflabError(f"timm has no model {name!r} ({err}); list them with "
                                   "python -c 'import timm; print(timm.list_models())'") from None
    return perflab.Workload(
        name=f"timm-{name}",
        model=model,
        dataset=RandomImages(pool=64, image_res=image_res, classes=classes, seed=cfg.seed),
        loss_fn=nn.CrossEntropyLoss(),
        description=f"timm {name} image classifier, random weights, synthetic images",
        is_classifier=True,
        default_data="device",
        info={"model": name, "image_res": image_res, "classes": classes},
    )
