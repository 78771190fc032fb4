"""Any timm image model: `perflab run --workload examples/timm_model.py --option model=convnext_tiny`.

Random weights (nothing is downloaded), synthetic images pre-staged on the device. Needs
`pip install 'perflab[models]'`. Its `--option` settings are declared in OPTIONS below.
"""
from torch import nn

import perflab
from perflab.workloads.resnet50 import RandomImages
from perflab.workloads.settings import ByDevice, resolve_settings, setting

OPTIONS = (
    setting("model", str, "timm model name (timm.list_models() lists them)", "resnet50"),
    setting("image_res", int, "image side in pixels", ByDevice(224, 64), minimum=16),
    setting("classes", int, "output classes", 1000, minimum=2),
)


def build(cfg) -> perflab.Workload:
    try:
        import timm
    except ImportError:
        raise perflab.PerflabError("examples/timm_model.py needs timm: pip install 'perflab[models]'") from None
    options = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    name, image_res, classes = options["model"], options["image_res"], options["classes"]
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
