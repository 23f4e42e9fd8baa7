"""Converters: Keras/SavedModel → ONNX (tf2onnx), scikit-learn → ONNX (skl2onnx), int8 quantization,
fp16 and TensorRT (guarded). Each writes an artifact that passes the ONNX checker."""
