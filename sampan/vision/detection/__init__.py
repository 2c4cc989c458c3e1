"""General object detection toolkit (issue 41, part 1): losses, task-aligned assigner, COCO reader.

Work in progress: the network (backbone + PAN neck + GFL head), decode, training runner and export
are not written yet; see docs/detection.md.
"""
