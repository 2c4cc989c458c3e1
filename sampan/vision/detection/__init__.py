"""General object detection toolkit (issue 41, part 1), PP-PicoDet-like and anchor-free.

Files: ``model`` (DetectorConfig, Detector: LCNet backbone, FPN neck, shared GFL head, decode + NMS,
save/load), ``assigner`` (task-aligned assignment), ``losses`` (GIoU, DFL, QFL), ``loss`` (the
training loss), ``coco`` (checked COCO reader, pycocotools mAP). Training: ``sampan finetune --task
detection``. See docs/detection.md.
"""
