"""pyzlog.core"""
