"""A small training script in the SageMaker script-mode style: hyperparameters as --key value,
data and model folders from SM_* variables. Fits a linear model with plain torch on CPU."""

import argparse
import json
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(512, 4)
    true_w = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    y = x @ true_w + 0.01 * torch.randn(512, 1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = time.time()
    for epoch in range(args.epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        print(f"epoch={epoch} loss={loss.item():.6f}", flush=True)
    path = os.path.join(os.environ["SM_MODEL_DIR"], "model.pt")
    torch.save(model.state_dict(), path)
    print(json.dumps({"final_loss": loss.item(), "seconds": round(time.time() - start, 3), "model": path}))


if __name__ == "__main__":
    main()
