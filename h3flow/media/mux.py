"""Frames + waveform -> MP4 (H.264 yuv420p + AAC 48 kHz stereo), written atomically.

The writer is the node pack's ``h3flow_nodes.mux`` (the ComfyUI save node and the local
engine write the same bytes with it); see that module for the timestamps and flags.
"""

from __future__ import annotations

from h3flow_nodes.mux import AAC_FRAME, X264_OPTIONS, Mp4Info, mux_mp4, probe_mp4

__all__ = ["AAC_FRAME", "X264_OPTIONS", "Mp4Info", "mux_mp4", "probe_mp4"]
